"""The control role: Raft state, reconciler, agent streams, the admin API."""
