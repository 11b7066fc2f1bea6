"""The leader's side of a `mirror://NAME` source (docs/mirror.md, "Fetching on the nodes"): a `start_replica` for a
model whose source is in the mirror says where the agent fetches it (`mirror`: the file's name, sha256 and size, and
the blob URLs of every control plane, the leader's first: `StartReplica.mirror` in llmgw/wire/protocol_agent.py).

The mirror's catalog is read through `MirrorCatalog` (name -> (sha256, size), None for a name it does not hold): a
start for a name the catalog lacks goes without `mirror`, and the agent fails that replica with "mirror file NAME
is not in the mirror" (agent/supervisor.py), a reason the operator sees on the model like any failed start."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llmgw.domain.state import ClusterState
from llmgw.wire import protocol
from llmgw.wire.protocol_agent import MAX_MIRROR_URLS

log = logging.getLogger("llmgw.control.mirror")

MirrorCatalog = Callable[[str], tuple[str, int] | None]  # a mirror file's name -> (its sha256, its size in bytes)

SCHEME = "mirror://"


def catalog_of(state: ClusterState) -> MirrorCatalog:
    """The replicated state's catalog (`ClusterState.mirror`), as a start reads it."""
    def find(name: str) -> tuple[str, int] | None:
        found = state.mirror.get(name)
        return (found.sha256, found.size) if found is not None else None

    return find


def blob_urls(bases: Sequence[str], sha256: str) -> list[str]:
    """The blob URLs of a file at each control plane (admin base URLs, the leader's first), each once."""
    urls = [base.rstrip("/") + protocol.MIRROR_BLOBS_PATH + sha256 for base in bases if base]
    return list(dict.fromkeys(urls))[:MAX_MIRROR_URLS]


def with_mirror(message: dict[str, Any], catalog: MirrorCatalog, bases: Sequence[str]) -> dict[str, Any] | None:
    """The message to send: a `start_replica` for a `mirror://NAME` source with `mirror` filled in (or without it
    when the catalog has no NAME: the agent refuses the start, saying so); any other message as it is. None: not
    now (no control plane's URL is known yet: this member's admin API is not listening yet); the next pass sends
    it."""
    if message.get("type") != "start_replica":
        return message
    model = message.get("model")
    source = model.get("source") if isinstance(model, Mapping) else None
    if not isinstance(source, str) or not source.startswith(SCHEME):
        return message
    name = source[len(SCHEME):]
    held = catalog(name)
    if held is None:
        log.warning("replica %s: mirror file %s is not in the mirror: its start is refused", message.get("replica_id"),
                    name)
        return message
    sha256, size = held
    urls = blob_urls(bases, sha256)
    if not urls:
        return None
    return {**message, "mirror": {"name": name, "sha256": sha256, "size": size, "urls": urls}}


def member_bases(own: str | None, announced: Mapping[str, str | None], leader: str) -> list[str]:
    """The control planes' admin base URLs, this one (the leader) first: `own`, then every other member's as it
    announced it (`announced`: Raft address -> admin URL), by address."""
    others = [url for addr, url in sorted(announced.items()) if addr != leader and url]
    return [u for u in [own or announced.get(leader) or "", *others] if u]
