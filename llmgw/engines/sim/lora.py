"""The simulator's LoRA adapters, vLLM-shaped: `POST /v1/load_lora_adapter {lora_name, lora_path}` (the file
must exist), `POST /v1/unload_lora_adapter {lora_name}`, the loaded ones listed in `GET /v1/models` with their
`parent`, and a request whose `model` names one answered as "sim[NAME] says: ...".

`--lora-lie` (failure injection): a load answers 200 and loads nothing, as engines were seen to do for a missing
path; the agent must not take it for loaded (llmgw/agent/adapters.py).
"""

from __future__ import annotations

import os
from typing import Any

from llmgw.errors import OpenAIError

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MAX_ADAPTERS = 256


class SimAdapters:
    def __init__(self, base: str, lie: bool = False) -> None:
        self.base = base
        self.lie = lie
        self.loaded: dict[str, str] = {}  # name -> file

    def answer(self, path: str, body: dict[str, Any]) -> str:
        """A load or an unload; its words on success (vLLM answers plain words too), else OpenAIError."""
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            raise OpenAIError(400, None, "lora_name must be a non-empty string", param="lora_name")
        if path == UNLOAD_PATH:
            if self.loaded.pop(name, None) is None:
                raise OpenAIError(404, None, f"The lora adapter '{name}' cannot be found.", param="lora_name")
            return f"Success: LoRA adapter '{name}' removed successfully."
        file = body.get("lora_path")
        if not isinstance(file, str) or not file:
            raise OpenAIError(400, None, "lora_path must be a non-empty string", param="lora_path")
        if self.lie:
            return f"Success: LoRA adapter '{name}' added successfully."  # and nothing loaded
        if name in self.loaded or name == self.base:
            raise OpenAIError(400, None, f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        if not os.path.isfile(file):
            raise OpenAIError(400, None, f"Loading lora {name} failed: No adapter found for {file}",
                              param="lora_path")
        if len(self.loaded) >= MAX_ADAPTERS:
            raise OpenAIError(400, None, f"at most {MAX_ADAPTERS} adapters are loaded at once", param="lora_name")
        self.loaded[name] = file
        return f"Success: LoRA adapter '{name}' added successfully."

    def models(self) -> list[dict[str, Any]]:
        return [{"id": name, "object": "model", "created": 0, "owned_by": "llmgw-sim", "root": file,
                 "parent": self.base} for name, file in sorted(self.loaded.items())]

    def speaker(self, model: Any) -> str:
        """Who answers a request naming `model`: "sim", or "sim[NAME]" for a loaded adapter."""
        return f"sim[{model}]" if isinstance(model, str) and model in self.loaded else "sim"
