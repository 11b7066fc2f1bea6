"""Each simulated node joins the cluster as a real machine does (llmgw/trust/join.py): a certificate of
its own, got once with a join token of its own, kept in STATE_DIR/nodes/NAME/tls; its agent then
authenticates its stream with that certificate alone.

The tokens are made here with the operator's admin key (LLMGW_KEY: the simulator is run by an
operator, the key never goes to a node), one per node that holds no certificate yet, a bounded number
at a time (`concurrency`): each token and each join is a commit of the leader's, and a thousand at
once would only queue there. A node that already holds its certificate (a fleet started again on the
same --state-dir) needs no token.

What the fleet trusts, before a node has its bundle: --ca-file, or the CA fetched once and checked
against --ca-hash (then written to STATE_DIR/ca.pem, so that no node fetches it again), or the
system's trust store.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

from llmgw.trust import ca, tls
from llmgw.trust.ca import new_key_pem
from llmgw.trust.files import DIR_NAME, MachineFiles, write_private
from llmgw.trust.join import CA_PATH, JoinError, JoinRequest, client_context, ensure_credentials

log = logging.getLogger("llmgw.simfleet")

TOKENS_PATH = "/api/v1/trust/tokens"
# A node's token is used at once; one left over (a fleet stopped while joining) expires with the default life.


@dataclass(frozen=True)
class NodeFiles(MachineFiles):
    """A simulated node's credential files, written as a machine writes them (0600 in a 0700 dir) but
    not fsynced: they are the simulator's scratch (a thousand nodes' three files each, fsynced one by
    one, were most of a fleet's start), and a node whose files a crash lost joins again."""

    def key_pem(self) -> str:
        if self.key.is_file():
            return self.key.read_text()
        pem = new_key_pem()
        _write(self.key, pem)
        return pem

    def write(self, cert_chain: str, bundle: str) -> None:
        _write(self.cert, cert_chain)
        _write(self.ca, bundle)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


@dataclass
class FleetTrust:
    """Where the fleet's nodes keep their credentials, and how they get them."""

    controls: list[str]  # https admin URLs
    state_dir: Path  # STATE_DIR/nodes/NAME/tls per node
    admin_key: str | None  # the operator's admin key: makes the tokens (None: every node must hold a certificate)
    ca_file: Path | None = None
    ca_hash: str | None = None
    concurrency: int = 32  # tokens and joins in flight at once
    timeout_s: float = 30.0  # each token, and each join per control plane (the join_request_s timeout)
    joined: int = field(default=0, init=False)  # nodes that joined in this run (the others had a certificate)
    _verify: ssl.SSLContext | bool = field(default=True, init=False)
    _anchor: Path | None = field(default=None, init=False)
    _limit: trio.CapacityLimiter = field(init=False)
    _client: httpx.AsyncClient | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._limit = trio.CapacityLimiter(self.concurrency)

    def files(self, node: str) -> NodeFiles:
        return NodeFiles(self.state_dir / "nodes" / node / DIR_NAME)

    async def open(self, nodes: list[str]) -> None:
        """Check the controls and the CA once, before any node joins."""
        for url in self.controls:
            if not url.startswith("https://"):
                raise JoinError(f"--control {url!r}: a node joins and follows control over TLS; give its https:// "
                                f"admin URL")
        if all(self.files(n).complete() for n in nodes):
            return
        log.info("sim-fleet: %d of %d nodes join now (a join token each, made with LLMGW_KEY, %d at a time)",
                 sum(not self.files(n).complete() for n in nodes), len(nodes), self.concurrency)
        if not self.admin_key:
            raise JoinError("set LLMGW_KEY (the operator's admin key): the fleet makes a join token for each "
                            "simulated node with it (nodes that joined before keep their certificates in "
                            "--state-dir and need none)")
        if self.ca_file is not None:
            self._anchor = self.ca_file
        elif self.ca_hash is not None:
            self._anchor = await self._pinned_bundle()
        if self._anchor is not None:
            try:
                self._verify = tls.client_context(self._anchor)
            except (OSError, ssl.SSLError) as e:
                raise JoinError(f"cannot use the CA file {self._anchor}: {e}") from None
        self._client = httpx.AsyncClient(verify=self._verify, timeout=self.timeout_s,
                                         limits=httpx.Limits(max_connections=self.concurrency),
                                         headers={"Authorization": f"Bearer {self.admin_key}"})

    async def aclose(self) -> None:
        """Close the tokens' client (once every node joined: the agents' streams use their own)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _pinned_bundle(self) -> Path:
        """The cluster's CA, fetched unverified from the first control that gives it, trusted only if
        its roots hash to --ca-hash; written to STATE_DIR/ca.pem for every node's join."""
        errors = []
        async with httpx.AsyncClient(verify=False, timeout=self.timeout_s) as client:  # noqa: S501 — checked below
            for url in self.controls:
                try:
                    answer = await client.get(url.rstrip("/") + CA_PATH)
                    bundle = answer.json().get("bundle") if answer.status_code == 200 else None
                except (httpx.HTTPError, ValueError) as e:
                    errors.append(f"{url}: {e}")
                    continue
                if not isinstance(bundle, str) or not bundle:
                    errors.append(f"{url}: {CA_PATH} answered {answer.status_code}")
                    continue
                found = ca.roots_hash(bundle)
                if found != self.ca_hash:
                    raise JoinError(f"the CA of {url} is not the one --ca-hash names ({found} != {self.ca_hash}): "
                                    f"a wrong address, or someone in the way; nothing was sent")
                path = self.state_dir / "ca.pem"
                write_private(path, bundle)
                return path
        raise JoinError("could not fetch the cluster's CA: " + "; ".join(errors))

    async def _token(self, node: str) -> str:
        """A join token for agent `node`, from the first control that makes one."""
        assert self._client is not None
        errors = []
        for url in self.controls:
            try:
                answer = await self._client.post(url.rstrip("/") + TOKENS_PATH,
                                                 json={"role": "agent", "name": node})
            except httpx.HTTPError as e:
                errors.append(f"{url}: {e}")
                continue
            if answer.status_code == 201:
                token: str = answer.json()["token"]
                return token
            errors.append(f"{url}: {answer.status_code} {answer.text[:200]}")
            if answer.status_code in (401, 403):
                break  # the key is refused: every control says the same
        raise JoinError(f"could not make a join token for node {node}: " + "; ".join(errors))

    async def contexts(self, nodes: list[str], hosts: Callable[[str], tuple[str, ...]]) -> dict[str, ssl.SSLContext]:
        """Every node's TLS context (`context`), `concurrency` joins at a time."""
        found: dict[str, ssl.SSLContext] = {}

        async def one(node: str) -> None:
            found[node] = await self.context(node, hosts(node))

        async with trio.open_nursery() as nursery:
            for node in nodes:
                nursery.start_soon(one, node)
        return found

    async def context(self, node: str, hosts: tuple[str, ...]) -> ssl.SSLContext:
        """Node `node`'s TLS context: its certificate, joined first if it has none."""
        files = self.files(node)
        if files.complete():  # joined before: checked to be this node's, nothing sent
            await ensure_credentials(files, self.controls, JoinRequest("agent", node, None))
        else:
            async with self._limit:
                token = await self._token(node)
                await ensure_credentials(files, self.controls,
                                         JoinRequest("agent", node, token, ca_file=self._anchor, hosts=hosts),
                                         timeout_s=self.timeout_s)
            self.joined += 1
        return client_context(files)
