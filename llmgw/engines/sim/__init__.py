"""The simulator engine: a real OpenAI-compatible HTTP server with deterministic answers, for tests,
benchmarks and `llmgw simfleet`. `app.py` is what it answers (the raw ASGI app), `requests.py` what it
reads from a request, `group.py` its part in a multi-node replica, `process.py` its server and command
line (`llmgw engine sim`, `python -m llmgw.engines.sim`).
"""

from llmgw.engines.sim.app import SimApp, SimOptions, make_app
from llmgw.engines.sim.process import EXIT_AFTER_STATUS, FAIL_START_STATUS, main, run, serve
from llmgw.engines.sim.requests import embed

__all__ = ["EXIT_AFTER_STATUS", "FAIL_START_STATUS", "SimApp", "SimOptions", "embed", "main", "make_app", "run", "serve"]
