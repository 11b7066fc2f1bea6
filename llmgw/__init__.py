"""llmgw: open-weight LLMs on your own fleet, behind one OpenAI-compatible endpoint."""

__version__ = "0.3.0"
