"""A machine's side of joining the cluster (agents and gateways): with a one-time join token, once,
it makes its key, sends a certificate request and keeps the certificate it gets; from then on it
authenticates with that certificate alone (`MachineFiles`, STATE_DIR/tls/).

What it trusts before it has the bundle: the CA file the operator gives (`--ca-file`), or the CA's
hash (`--ca-hash`, printed by `ctl nodes token create`): the machine fetches the CA's certificates
without verifying, checks their hash against the one given, and only then sends its token over a
connection verified with them. With neither, the system's trust store (a site whose root is already
installed on its machines).
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx

from llmgw import startup
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.trust import ca, tls
from llmgw.trust.files import MachineFiles

log = logging.getLogger("llmgw.trust")

JOIN_PATH = "/api/v1/trust/join"
CA_PATH = "/api/v1/trust/ca"


class JoinError(startup.CannotStart):
    """The machine could not join; the message says why and what to do (never the token)."""


@dataclass(frozen=True)
class JoinRequest:
    role: str
    name: str
    token: str | None  # None: the machine must already hold a certificate
    ca_hash: str | None = None
    ca_file: Path | None = None
    hosts: tuple[str, ...] = ()  # names and addresses the machine is reached at (its certificate's SANs)


def client_context(files: MachineFiles) -> ssl.SSLContext:
    """The context a joined machine dials control with: the bundle it got, and its certificate."""
    return tls.client_context(files.ca, files.cert, files.key)


async def _anchor(control: str, req: JoinRequest, timeout_s: float) -> ssl.SSLContext | bool:
    if req.ca_file is not None:
        try:
            return tls.client_context(req.ca_file)
        except (OSError, ssl.SSLError) as e:
            raise JoinError(f"cannot use --ca-file {req.ca_file}: {e}") from None
    if req.ca_hash is None:
        return True  # the system's trust store
    # Fetched unverified; trusted only if its roots hash to what the operator gave.
    async with httpx.AsyncClient(verify=False, timeout=timeout_s) as client:  # noqa: S501 — checked below
        try:
            answer = await client.get(control.rstrip("/") + CA_PATH)
            bundle = answer.json().get("bundle") if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as e:
            raise JoinError(f"cannot fetch the cluster's CA from {control}: {e}") from None
    if not isinstance(bundle, str) or not bundle:
        raise JoinError(f"{control} did not give its CA ({CA_PATH} answered {answer.status_code})")
    found = ca.roots_hash(bundle)
    if found != req.ca_hash:
        raise JoinError(f"the CA of {control} is not the one --ca-hash names ({found} != {req.ca_hash}): a wrong "
                        f"address, or someone in the way; nothing was sent")
    return _pinned(bundle)


def _pinned(bundle: str) -> ssl.SSLContext:
    context = tls.client_context(None)
    context.load_verify_locations(cadata=bundle)
    return context


async def ensure_credentials(files: MachineFiles, controls: list[str], req: JoinRequest, *,
                             timeout_s: float = TIMEOUTS.join_request_s) -> MachineFiles:
    """This machine's credential: the one on disk, or a new one got with the join token from the
    first control plane that answers. Raises JoinError."""
    if files.complete():
        who = files.identity()
        if (who.role, who.name) != (req.role, req.name):
            raise JoinError(f"{files.cert} is the certificate of {who.role} {who.name!r}, not of {req.role} "
                            f"{req.name!r}: use that name, or another state dir")
        return files
    if not req.token:
        raise JoinError(f"this machine holds no certificate of the cluster ({files.directory}): give a join token "
                        f"(--join-token, made by `llmgw ctl nodes token create --role {req.role}`)")
    key = files.key_pem()
    csr = ca.make_request(key, req.role, req.name)
    errors = []
    for control in controls:
        if not control.startswith("https://"):
            errors.append(f"{control}: a machine joins over TLS (an https:// admin URL)")
            continue
        try:
            verify = await _anchor(control, req, timeout_s)
        except JoinError as e:  # this one is down, or not the cluster the hash names: the next may do
            errors.append(str(e))
            continue
        async with httpx.AsyncClient(verify=verify, timeout=timeout_s) as client:
            try:
                answer = await client.post(control.rstrip("/") + JOIN_PATH,
                                           json={"token": req.token, "role": req.role, "name": req.name,
                                                 "csr": csr, "hosts": list(req.hosts)})
            except httpx.HTTPError as e:
                errors.append(f"{control}: {e}")
                continue
        try:
            doc = answer.json()
        except ValueError:
            doc = {}
        if answer.status_code == 201 and isinstance(doc.get("certificate"), str) and isinstance(doc.get("ca"), str):
            files.write(doc["certificate"], doc["ca"])
            log.info("joined the cluster as %s %s (certificate serial %s)", req.role, req.name, doc.get("serial"))
            return files
        message = (doc.get("error") or {}).get("message") if isinstance(doc, dict) else None
        raise JoinError(f"{control} refused the join ({answer.status_code}): {message or answer.text[:200]}")
    raise JoinError("could not reach a control plane to join: " + "; ".join(errors))
