"""The replicated state store: Raft (pysyncobj) under a trio-friendly face.

This package is the only code that imports pysyncobj. See `raft.py`.
"""

from llmgw.store.raft import (CommitUnknown, LeadershipUnconfirmed, NotLeader, RaftStore, RunInThread, StoreNotReady,
                              StoreUnavailable)

__all__ = ["CommitUnknown", "LeadershipUnconfirmed", "NotLeader", "RaftStore", "RunInThread", "StoreNotReady",
           "StoreUnavailable"]
