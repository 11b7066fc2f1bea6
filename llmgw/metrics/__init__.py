"""Prometheus metrics (docs/observability.md): families built at scrape time by custom collectors, each
role in its own CollectorRegistry (never the process-wide default one), so `llmgw up`'s roles never collide.

control.py: the control plane's families, all derived from the status summary and the store's Raft status;
gateway.py: the gateway's request counters (plain ints on the request path) and their families;
expose.py: the exposition answer and the small family builders both share.
"""
