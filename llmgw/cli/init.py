"""`llmgw init`: the first control plane of a new cluster, on this machine, as a service.

Each step looks before it acts and says what it found, so a second run on a live cluster changes
nothing and says so, step by step:

1. the state dir (made 0700; an existing one is kept, and made the owner's alone);
2. the cluster secret (made in the state dir once; kept after);
3. the first admin key: on a group that never started, a new key, shown once at the end and kept
   nowhere, its hash left in the state dir (`first-admin-key.json`) for the control plane's first
   start, which removes it once the group holds the key; on a group that has state, none;
4. the control plane's service (`llmgw service install control`: replaced only when its flags changed);
5. the service started (left alone when it runs);
6. the control plane answering on its admin API, with the cluster's CA and its certificate made;
7. STATE_DIR/credentials.json naming the admin URL and the CA file (never a key), for `llmgw ctl`.

Then the next steps: a join token, and the machines to add.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
from pathlib import Path
from typing import Annotated, Literal

import httpx
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_API, EXIT_OK, EXIT_USAGE
from llmgw.domain.keys import hash_key, new_key
from llmgw.statedir import FIRST_ADMIN_FILE
from llmgw.cli.roles import env_timeouts
from llmgw.domain.timeouts import Timeouts
from llmgw.service.manager import ServiceError
from llmgw.trust.files import write_private
from llmgw.service.spec import ServiceSpec, SpecError, install as install_spec, load, services_dir



def init(*, state_dir: Path = Path("/var/lib/llmgw/control"), raft_addr: str, admin_addr: str,
         admin_url: str | None = None, floating_address: str | None = None, floating_interface: str | None = None,
         tls_name: list[str] | None = None,
         service_dir: Annotated[Path | None, Parameter(name="--service-dir")] = None,
         manager: Literal["auto", "systemd", "builtin"] = "auto") -> int:
    """Make the first control plane of a new cluster here, installed and started as a service.

    Parameters
    ----------
    state_dir
        The control plane's state dir (Raft journal, the CA's root key, logs).
    raft_addr
        HOST:PORT this member's Raft listens on (the address the next members dial).
    admin_addr
        HOST:PORT of the admin API (TLS).
    admin_url
        The URL machines and operators reach the admin API at (default: from --admin-addr).
    floating_address
        ADDR/PREFIX held by whichever member leads.
    floating_interface
        The interface the floating address goes on.
    tls_name
        Another DNS name or address the member's certificate carries (repeat the flag).
    service_dir
        The services' dir (else $LLMGW_SERVICE_DIR, else /var/lib/llmgw/services).
    manager
        Who runs the service: systemd's llmgw-control unit, the built-in supervisor, or auto.
    """
    from llmgw.cli.service import manager_for
    from llmgw.store import secret as cluster_secret

    def step(name: str, words: str) -> None:
        print(f"{name:<14} {words}", flush=True)

    where = services_dir(service_dir)
    flags = ["--state-dir", str(state_dir.resolve()), "--raft-addr", raft_addr, "--admin-addr", admin_addr]
    flags += ["--admin-url", admin_url] if admin_url else []
    flags += ["--floating-address", floating_address] if floating_address else []
    flags += ["--floating-interface", floating_interface] if floating_interface else []
    for name in tls_name or []:
        flags += ["--tls-name", name]
    try:
        spec = ServiceSpec("control", tuple(flags))
        before = load(where, "control")
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE

    # 1. the state dir
    if state_dir.is_dir():
        step("state dir", f"{state_dir}: exists, kept")
    else:
        state_dir.mkdir(parents=True, mode=0o700)
        step("state dir", f"{state_dir}: made (0700)")
    os.chmod(state_dir, 0o700)

    # 2. the cluster secret
    secret_path = state_dir / cluster_secret.FILE_NAME
    had_secret = secret_path.exists()
    try:
        cluster_secret.load_or_create(state_dir, None)
    except cluster_secret.SecretError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    step("cluster secret", f"{secret_path}: {'present, kept' if had_secret else 'made (0600)'}")

    # 3. the first admin key
    shown: str | None = None
    started_before = (state_dir / "raft").exists()
    if started_before:
        step("admin key", "the group has started before: no key made (`llmgw ctl keys create` makes more)")
    else:
        shown = new_key()
        write_private(state_dir / FIRST_ADMIN_FILE, json.dumps({"key_hash": hash_key(shown)}))
        step("admin key", "made; shown once below, kept nowhere (its hash waits for the first start)")

    # 4. the service
    if before == spec:
        step("service", f"control: installed as asked, unchanged ({where})")
    else:
        install_spec(where, spec)
        step("service", f"control: {'installed' if before is None else 'flags changed, installed again'} ({where})")

    # 5. started
    m = manager_for(where, manager)
    try:
        st = m.status("control")
        if st.state == "running" and before == spec:
            step("started", f"control: running already (pid {st.pid}, {m.name})")
        else:
            st = m.restart("control") if st.state == "running" else m.start("control")
            step("started", f"control: {st.state} (pid {st.pid}, {m.name})")
    except ServiceError as e:
        print(f"error: the control plane's service did not start: {e}", file=sys.stderr)
        return EXIT_API

    # 6. answering, with its CA and certificate
    url = (admin_url or f"https://{admin_addr}").rstrip("/")
    ca_file = state_dir / "tls" / "ca.pem"
    answer = _wait_ready(url, ca_file, env_timeouts())
    if answer is not None:
        print(f"error: {answer}", file=sys.stderr)
        return EXIT_API
    step("answering", f"{url}: the admin API answers over TLS (CA {ca_file})")

    # 7. credentials for ctl (the URL and the CA: no key)
    creds = state_dir / "credentials.json"
    doc = {"admin_url": url, "ca_file": str(ca_file)}
    try:
        same = json.loads(creds.read_text(encoding="utf-8")) == doc
    except (OSError, json.JSONDecodeError):
        same = False
    if same:
        step("credentials", f"{creds}: unchanged")
    else:
        write_private(creds, json.dumps(doc, indent=2))
        step("credentials", f"{creds}: the admin URL and the CA file (no key)")

    print()
    if shown is not None:
        print(f"The first admin key (shown this once; store it in your secrets manager):\n\n    {shown}\n")
    print("Next:")
    print(f"  export LLMGW_URL={url} LLMGW_CA_FILE={ca_file} LLMGW_KEY=<the admin key>")
    print("  llmgw ctl nodes token create --role agent     # a one-time join token for each machine")
    print("  llmgw ctl ca show                              # the --ca-hash the machines pin")
    print(f"  llmgw agent --control {url} --join-token TOKEN --ca-hash HASH --state-dir /var/lib/llmgw/agent")
    print(f"  more control planes: llmgw control --join --peer {raft_addr} --cluster-secret-file "
          f"{secret_path} ... then `llmgw ctl members add`")
    print("  docs/install.md walks through the rest (the floating address, firewall ports, systemd)")
    return EXIT_OK


def _wait_ready(url: str, ca_file: Path, timeouts: Timeouts) -> str | None:
    """None once `url` answers over TLS verified with `ca_file`; else why not, after `init_ready_s`."""
    limit_s = timeouts.init_ready_s
    deadline = time.monotonic() + limit_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if ca_file.is_file():
            try:
                context = ssl.create_default_context(cafile=str(ca_file))
                r = httpx.get(url + "/api/v1/cluster/self", verify=context,
                              timeout=max(timeouts.service_poll_s, deadline - time.monotonic()))
                if r.status_code in (200, 401, 403):  # it answers; who may read it is not this step's
                    return None
                last = f"HTTP {r.status_code}"
            except (httpx.HTTPError, ssl.SSLError, OSError) as e:
                last = str(e) or type(e).__name__
        else:
            last = f"{ca_file} not made yet"
        time.sleep(timeouts.service_poll_s)
    return (f"the control plane did not answer at {url} within {limit_s:g} s ({last}); "
            f"`llmgw service status control` and its log say why")

