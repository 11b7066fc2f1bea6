"""`llmgw sim-fleet`: many simulated nodes in one process, each a real agent on its own stream to
control, running simulated engines in-process behind one HTTP server (docs/operations.md).

nodes.py: what each node reports (GPUs, MIG, fabric, storage); engines.py: the in-process engines
and the one server they answer on; fleet.py: `serve(FleetConfig)`, to run a fleet from a test or
a benchmark; command.py: the command line (its imports wait for the command to run, so `--help`
stays fast).
"""
