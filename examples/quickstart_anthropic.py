"""Talk to `llmgw up` with the official anthropic SDK (credentials from the state dir)."""

import json
import os
from pathlib import Path

from anthropic import Anthropic

creds = json.loads((Path(os.environ.get("LLMGW_STATE_DIR", ".llmgw")) / "credentials.json").read_text())
# The SDK adds /v1/messages itself; the key goes as x-api-key, as to Anthropic.
client = Anthropic(base_url=creds["gateway_url"].removesuffix("/v1"), api_key=creds["client_key"])

message = client.messages.create(
    model="demo",
    max_tokens=64,
    messages=[{"role": "user", "content": "hello from the anthropic SDK"}],
)
print(message.content[0].text)

with client.messages.stream(
    model="demo",
    max_tokens=64,
    messages=[{"role": "user", "content": "now stream it"}],
) as stream:
    for text in stream.text_stream:
        print(text, end="", flush=True)
print()
