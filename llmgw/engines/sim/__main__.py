"""`python -m llmgw.engines.sim`: the same process as `llmgw engine sim`."""

import sys

from llmgw.engines.sim.process import main

if __name__ == "__main__":
    sys.exit(main())
