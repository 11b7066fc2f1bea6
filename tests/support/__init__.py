"""The suite's own harness, which the product does not ship: real processes and clusters (`cluster`,
`processes`), the fault catalog and its worlds (`fault_catalog`, `faults`), the Raft fault campaign and
its linearizability checker (`campaign`, `linearizability`), the fuzzers (`fuzz_http`, `admin_fuzz`),
weight files (`tiny_gguf`, `weights_tree`) and `fsync_cost`.

Tests import it as `tests.support.NAME` (pytest puts the repository root on sys.path: `pythonpath` in
pyproject.toml); the runners in tests/bench put the root on sys.path themselves. The fakes and builders a
user's own tests may import stay in `llmgw.testing`, which the package ships.
"""
