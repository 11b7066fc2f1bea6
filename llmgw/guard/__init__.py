"""Guardrails' judge protocol, outside any role: the Llama Guard 3 prompt and its strict parser
(`prompt.py`), the texts a request and its answer carry (`texts.py`) and the verdict cache (`cache.py`)."""
