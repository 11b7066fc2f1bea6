"""The only unpickler pysyncobj gets: plain data and pysyncobj's own node, nothing a sender names.

pysyncobj pickles its Raft messages and log entries (protocol 2). Everything it unpickles came from
the network, sealed with the cluster secret: each frame, a log entry reassembled from chunks, each
command it applies and each membership change, all through `pysyncobj.pickle.loads`. `install()`
puts `loads` there, so a leaked secret lets a sender write plain values, never call a function.

What a protocol-2 pickle of pysyncobj's messages names (recorded over a three-member group that
committed, forwarded, compacted, sent a snapshot and changed members; `find_class` is asked for
these and nothing else): `_codecs.encode` (how protocol 2 writes bytes), `__builtin__.bytes` (an
empty bytes) and `pysyncobj.node.TCPNode` (a membership change). Each is given as a function that
accepts only that use: `bytes(10**12)` or another codec is refused, not run.
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any, Callable

import pysyncobj.pickle
from pysyncobj.node import TCPNode


class RefusedPickle(pickle.UnpicklingError):
    """A pickle that names something outside the allowlist (`what`), or uses an allowed name otherwise
    than pysyncobj does. Nothing it names was called."""

    def __init__(self, what: str) -> None:
        super().__init__(f"holds {what}, which the Raft wire does not carry")
        self.what = what


def _empty_bytes(*args: Any) -> bytes:
    if args:  # protocol 2 writes b"" as bytes(); bytes(n) would allocate n bytes
        raise RefusedPickle(f"bytes{args!r:.40}")
    return b""


def _latin1(text: Any, encoding: Any = None) -> bytes:
    # Protocol 2 writes b"..." as _codecs.encode("...", "latin1"); any other codec is not ours.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise RefusedPickle(f"_codecs.encode(..., {encoding!r:.40})")
    return text.encode("latin1")


ALLOWED: dict[tuple[str, str], Callable[..., Any] | type] = {
    ("_codecs", "encode"): _latin1,
    ("__builtin__", "bytes"): _empty_bytes,  # the Python 2 name protocol 2 writes
    ("builtins", "bytes"): _empty_bytes,
    ("pysyncobj.node", "TCPNode"): TCPNode,
}


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED.get((module, name))
        if found is None:
            raise RefusedPickle(f"{module}.{name}"[:120])
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("a persistent id")


def load(file: IO[bytes]) -> Any:
    """The value in `file`; `RefusedPickle` for a name outside `ALLOWED` (nothing is called), or
    `pickle.UnpicklingError` and the like for a damaged pickle."""
    return _Restricted(file).load()


def loads(data: bytes | str) -> Any:
    return load(io.BytesIO(data if isinstance(data, bytes) else data.encode()))


def install() -> None:
    """Make `loads`/`load` the ones pysyncobj calls. Its modules (tcp_connection, syncobj,
    serializer) call them as `pysyncobj.pickle.loads(...)` through the module, so replacing the
    module's attributes reaches every call, however early they were imported. pysyncobj's own
    `loads` would retry a failure with Python's pure unpickler, unrestricted: that is gone too."""
    pysyncobj.pickle.loads = loads
    pysyncobj.pickle.load = load
