"""A control plane's part in the cluster's trust: it makes the CA when a new group has none, keeps
its own certificate (the one its listeners serve), keeps the trust bundle file current through
rotations, and signs machines' certificate requests (`issue`).

- The root is made once, by the member that leads a fresh group, in STATE_DIR/ca/ (root.key 0600);
  or brought by the operator (`--ca-root DIR` holding root.pem and root.key, made offline: that
  member copies them at its first start). Its key never enters the Raft state.
- Intermediates are signed by the root and replicated sealed with the cluster secret
  (`trust.ca_add`), so every member that holds the secret can sign, and a failover keeps signing.
- A control plane's own certificate is signed locally by whichever authority is active (no token: it
  holds the secret), recorded through the leader (`trust.issue`), and renewed at two thirds of its
  life. Listeners start once it exists.
- Between members, Raft speaks TLS with those certificates (`RaftPeers`, the store's `RaftPeerTls`).
  A new group starts sealed-only (no member has a certificate before its CA exists); once every
  member holds one, the leader commits `trust.raft_tls` and from then on every member refuses a
  connection without TLS. A member that joins later brings a certificate: a join token for the
  control role (`llmgw control --join --join-token ...`).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from llmgw import startup
from llmgw.domain import commands
from llmgw.domain.commands import trust as trust_commands
from llmgw.domain.state import ClusterState
from llmgw.domain.trust import machine_id
from llmgw.errors import AdminError
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.interfaces import WritableStore
from llmgw.store.secret import FILE_NAME as SECRET_FILE
from llmgw.store.secret import read_file as read_secret
from llmgw.trust import ca, tls
from llmgw.trust.peer import PeerRefused, authorize
from llmgw.trust.files import MachineFiles, write_private

log = logging.getLogger("llmgw.control")

CA_DIR = "ca"
RENEW_AT = 2 / 3  # of a certificate's lifetime


def root_files(state_dir: Path) -> tuple[Path, Path]:
    return state_dir / CA_DIR / "root.pem", state_dir / CA_DIR / "root.key"


def bundle(state: ClusterState) -> str:
    """The PEM text a machine trusts: every root of the cluster's authorities, then the
    intermediates (so a peer that sends its leaf alone is still verified)."""
    roots = dict.fromkeys(a.root_pem.strip() for _, a in sorted(state.authorities.items()))
    inters = [a.cert_pem.strip() for _, a in sorted(state.authorities.items())]
    return "\n".join([*roots, *inters]) + "\n"


def active(state: ClusterState) -> str | None:
    """The id of the authority that signs now (the newest active one)."""
    live = [(a.added_at, aid) for aid, a in state.authorities.items() if a.active]
    return max(live)[1] if live else None


def due(not_after: float, issued_at: float, now: float) -> bool:
    """Whether a certificate living issued_at..not_after is due for renewal at `now`."""
    return now >= issued_at + (not_after - issued_at) * RENEW_AT


@dataclass
class Trust:
    """One control plane's keeper of the cluster's trust (see the module's docstring)."""

    state_dir: Path
    store: WritableStore
    clock: Callable[[], float]
    name: str  # this control plane's machine name (its Raft address)
    hosts: tuple[str, ...]  # the names and addresses its listeners are reached at
    ca_root: Path | None = None  # `--ca-root`: a dir with the operator's root.pem and root.key
    timeouts: Timeouts = TIMEOUTS
    # The Raft group's members (addresses, this one's included), for `trust.raft_tls`; None: not asked.
    group: Callable[[], list[str]] | None = None
    # This member's Raft link to each other one ("tls", "sealed", "down"): `RaftStore.status()["links"]`.
    links: Callable[[], dict[str, str]] | None = None
    files: MachineFiles = field(init=False)
    _issued_at: float = field(default=0.0, init=False)
    _contexts: list[ssl.SSLContext] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.files = MachineFiles.of(self.state_dir)

    def server_context(self) -> ssl.SSLContext:
        """A listener's TLS context with this member's certificate, asking clients for theirs; kept
        current: a renewal or a rotation reloads it in place (no listener restarts, no connection drops)."""
        context = tls.server_context(self.files.cert, self.files.key, self.files.ca)
        self._contexts.append(context)
        return context

    def client_context(self) -> ssl.SSLContext:
        """What this member dials other members and gateways with: the bundle, and its certificate."""
        context = tls.client_context(self.files.ca, self.files.cert, self.files.key)
        self._contexts.append(context)
        return context

    def _reload(self) -> None:
        for context in self._contexts:
            context.load_cert_chain(str(self.files.cert), str(self.files.key))
            context.load_verify_locations(cafile=str(self.files.ca))

    # -- signing --------------------------------------------------------------------------------

    def secret(self) -> str:
        return read_secret(self.state_dir / SECRET_FILE)

    def authority(self, state: ClusterState) -> tuple[str, ca.Issued]:
        """The active authority and its key, unsealed with this member's secret; AdminError if none."""
        aid = active(state)
        if aid is None:
            raise AdminError(503, "no_authority", "the cluster has no certificate authority yet (its first leader "
                             "makes one); retry in a moment")
        a = state.authorities[aid]
        try:
            return aid, ca.Issued(a.cert_pem, ca.unseal(a.key_sealed, self.secret()))
        except ca.CaError as e:
            raise AdminError(500, "authority_sealed", str(e)) from None

    def sign(self, state: ClusterState, csr_pem: str, *, role: str, name: str, hosts: tuple[str, ...],
             now: float) -> tuple[str, ca.Identity, str]:
        """(certificate chain PEM, its identity, the authority id) for a request; AdminError 400 if
        the request is unusable."""
        aid, authority = self.authority(state)
        try:
            cert = ca.sign_request(csr_pem, authority, role=role, name=name, hosts=hosts, now=now,
                                   lifetime_s=self.timeouts.cert_life_s)
        except ca.CaError as e:
            raise AdminError(400, "invalid_request", str(e)) from None
        return cert + authority.cert_pem, ca.identity(cert), aid

    # -- the CA of a new group ------------------------------------------------------------------

    def _root(self, now: float) -> ca.Issued:
        """This member's root: the one in its state dir, else the operator's (`--ca-root`), else new."""
        pem, key = root_files(self.state_dir)
        if not (pem.is_file() and key.is_file()):
            if self.ca_root is not None:
                for src, dst in ((self.ca_root / "root.pem", pem), (self.ca_root / "root.key", key)):
                    try:
                        write_private(dst, src.read_text())
                    except OSError as e:
                        raise AdminError(500, "ca_root", f"cannot copy {src}: {e.strerror}") from None
                log.info("the cluster's root CA is the operator's, from %s", self.ca_root)
            else:
                made = ca.make_root(self.name, now, self.timeouts.ca_root_life_s)
                write_private(key, made.key_pem)
                write_private(pem, made.cert_pem)
                log.info("made the cluster's root CA (%s): its key stays in %s", pem, key)
        return ca.Issued(pem.read_text(), key.read_text())

    def holds_root(self) -> bool:
        pem, key = root_files(self.state_dir)
        return pem.is_file() and key.is_file()

    async def make_intermediate(self, *, activate: bool = True) -> str:
        """A new intermediate signed by this member's root, committed; its id. At a group's first
        start, and by `ctl ca rotate` on the member holding the root."""
        now = self.clock()
        root = self._root(now)
        inter = ca.make_intermediate(root, now, self.timeouts.ca_intermediate_life_s)
        aid = ca.serial_hex(ca.load_cert(inter.cert_pem))
        await self.store.submit(trust_commands.ca_add(aid, inter.cert_pem, ca.seal(inter.key_pem, self.secret()),
                                                      root.cert_pem, ca.not_after(inter.cert_pem), now,
                                                      activate=activate), through_leader=True)
        return aid

    # -- this member's certificate ---------------------------------------------------------------

    def own_certificate_due(self, state: ClusterState, now: float) -> bool:
        if not self.files.complete():
            return True
        try:
            who = ca.identity(self.files.cert.read_text(), {aid: ca.load_cert(a.cert_pem)
                                                            for aid, a in state.authorities.items()})
        except ca.CaError:
            return True
        issued = self._issued_at or (who.not_after - self.timeouts.cert_life_s)
        return not who.issuer_serial or who.serial in state.revoked or due(who.not_after, issued, now)

    async def renew_own(self, state: ClusterState) -> None:
        """A new certificate for this member, recorded in the cluster before it is used (peers accept a
        control plane's certificate only once recorded, and a revoked one's record is refused); the
        first one of a new member is used even if it cannot be recorded yet."""
        now = self.clock()
        key = self.files.key_pem()
        chain, who, aid = self.sign(state, ca.make_request(key, "control", self.name), role="control",
                                    name=self.name, hosts=self.hosts, now=now)
        try:
            await self.store.submit(trust_commands.issue("control", self.name, who.serial, who.not_after, aid, now),
                                    through_leader=True)
        except commands.CommandError as e:
            if e.code == "revoked":
                raise
            log.warning("could not record this control plane's certificate in the cluster: %s", e.message)
            if self.files.complete():
                return  # the current one serves; retried at the next change
        except Exception as e:  # noqa: BLE001 — logged, retried at the next change
            log.warning("could not record this control plane's certificate in the cluster: %s", e)
            if self.files.complete():
                return
        self.files.write(chain, bundle(self.store.snapshot()))
        self._issued_at = now
        self._reload()
        log.info("this control plane's certificate: serial %s, valid until %s", who.serial,
                 _when(who.not_after))

    async def ready(self) -> None:
        """Return once this member has a certificate of the cluster's CA (making the CA first if
        this member leads a group that has none)."""
        state = self.store.snapshot()
        while True:
            if state.authorities:
                if self.own_certificate_due(state, self.clock()):
                    try:
                        await self.renew_own(state)
                    except commands.CommandError as e:  # revoked
                        raise startup.CannotStart(f"this control plane's certificate cannot be renewed: {e.message}; "
                                                  f"remove its state dir and join it with a token for the control "
                                                  f"role (docs/security.md)") from None
                return
            if self.store.is_leader():
                try:
                    await self.make_intermediate()
                except commands.CommandError as e:
                    log.warning("could not add the cluster's CA: %s", e.message)
                state = self.store.snapshot()
                continue
            with trio.move_on_after(self.timeouts.trust_ca_wait_s):  # leadership may come without a state change
                state = await self.store.wait_changed(state.revision)
            state = self.store.snapshot()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the certificate and the bundle current: renew at two thirds, replace the bundle
        after a rotation, a new certificate if this one was revoked or its authority dropped."""
        await self.ready()
        task_status.started()
        state = self.store.snapshot()
        while True:
            if self.files.write_bundle(bundle(state)):
                self._reload()
            if state.authorities and self.own_certificate_due(state, self.clock()):
                try:
                    await self.renew_own(state)
                except (AdminError, commands.CommandError) as e:
                    log.warning("could not renew this control plane's certificate: %s", e.message)
            recheck = self.timeouts.trust_recheck_s
            if not state.raft_tls_since and self.store.is_leader():
                await self._require_raft_tls(state)
                # Its links move to TLS with no change of the state: looked at again soon (a group that
                # waited `trust_recheck_s` here ran sealed-only for a minute after every start).
                recheck = self.timeouts.raft_tls_switch_poll_s
            with trio.move_on_after(recheck):
                state = await self.store.wait_changed(state.revision)

    async def _require_raft_tls(self, state: ClusterState) -> None:
        """On the leader: once every member of the group holds a control certificate, the group
        requires TLS between its members (`trust.raft_tls`)."""
        members = self.group() if self.group is not None else []
        links = self.links() if self.links is not None else {}
        # Each holds its certificate and has announced itself (the last step of its start: its links then
        # carry no start-up write when they are dialled again over TLS), and speaks TLS with this leader
        # (an older llmgw, in a rolling upgrade, speaks none: the group waits for its upgrade).
        if not members or any(machine_id("control", m) not in state.machines or m not in state.members
                              or (m != self.name and links.get(m) != "tls") for m in members):
            return
        try:
            await self.store.submit(trust_commands.raft_tls(sorted(members), self.clock()), through_leader=True)
        except Exception as e:  # noqa: BLE001 — retried at the next change
            log.warning("could not make the group require TLS between its members yet: %s", e)
            return
        log.info("every member holds a control certificate: the group requires TLS between its members from now "
                 "on (%s)", ", ".join(sorted(members)))


@dataclass
class RaftPeers:
    """The store's `RaftPeerTls`: Raft connections between members speak TLS with this member's
    control certificate (STATE_DIR/tls), and accept a peer whose certificate is a current control
    plane's of this cluster, naming the member it says it is. Called on pysyncobj's thread: contexts
    are rebuilt when the files change (a renewal, a rotation's new bundle), the state is the last
    applied one."""

    files: MachineFiles
    state: Callable[[], ClusterState]
    clock: Callable[[], float]
    name: str = ""  # this member's Raft address
    _made: tuple[object, ssl.SSLContext, ssl.SSLContext] | None = field(default=None, init=False)

    def _contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
        files = self.files
        try:
            stamp = tuple(f.stat().st_mtime_ns for f in (files.cert, files.key, files.ca))
        except OSError:
            return None
        if self._made is None or self._made[0] != stamp:
            try:
                server = tls.server_context(files.cert, files.key, files.ca)
                server.verify_mode = ssl.CERT_REQUIRED
                client = tls.client_context(files.ca, files.cert, files.key)
                client.check_hostname = False  # a member is checked by the name in its certificate (check_peer)
            except (OSError, ssl.SSLError, ValueError) as e:
                log.warning("cannot load this member's certificate for Raft (%s): dialling sealed only", e)
                return None
            self._made = (stamp, server, client)
        return self._made[1], self._made[2]

    def server_context(self) -> ssl.SSLContext | None:
        made = self._contexts()
        return made[0] if made is not None else None

    def client_context(self, peer: str) -> ssl.SSLContext | None:
        """TLS once this member has a certificate and the peer can answer over TLS: its certificate is
        recorded, or the group requires TLS. A member with a certificate and no state yet (rejoining
        from nothing) dials over TLS: its group surely requires it."""
        made = self._contexts()
        if made is None:
            return None
        state = self.state()
        if state.authorities and not state.raft_tls_since and machine_id("control", peer) not in state.machines:
            return None  # a new group's member without its certificate yet would refuse TLS
        return made[1]

    def check_peer(self, cert_der: bytes | None, name: str | None) -> str | None:
        state = self.state()
        try:
            if state.authorities:
                who = authorize(cert_der, state, self.clock(), role="control")
            else:  # no state yet (a member rejoining from nothing): the handshake checked it against its bundle file
                who = ca.identity(cert_der or b"")
                if who.role != "control":
                    return f"a {who.role}'s certificate ({who.name}) cannot speak as a control plane"
        except PeerRefused as e:
            return str(e)
        except (ca.CaError, ValueError) as e:
            return f"its certificate names no machine of this cluster: {e}"
        if name is not None and who.name != name:
            return f"its certificate is control plane {who.name}'s, not {name}'s"
        return None

    def settled(self, peer: str) -> bool:
        members = self.state().members
        return self.name in members and peer in members

    def plain_refused(self) -> str | None:
        since = self.state().raft_tls_since
        if not since:
            return None
        return (f"this group requires TLS between its members since {_when(since)} (a member without a "
                f"certificate joins with a token: llmgw ctl nodes token create --role control)")


def _when(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
