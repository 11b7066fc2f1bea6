"""Talk to `llmgw up` with the official openai SDK (credentials from the state dir)."""

import json
import os
from pathlib import Path

from openai import OpenAI

creds = json.loads((Path(os.environ.get("LLMGW_STATE_DIR", ".llmgw")) / "credentials.json").read_text())
client = OpenAI(base_url=creds["gateway_url"], api_key=creds["client_key"])

reply = client.chat.completions.create(
    model="demo",
    messages=[{"role": "user", "content": "hello from the SDK"}],
)
print(reply.choices[0].message.content)

for chunk in client.chat.completions.create(
    model="demo",
    messages=[{"role": "user", "content": "now stream it"}],
    stream=True,
):
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
print()

vectors = client.embeddings.create(model="demo-embed", input=["llmgw", "gateway"])
print(len(vectors.data), "vectors of", len(vectors.data[0].embedding), "dimensions")

answer = client.responses.create(model="demo", input="hello from the Responses API")
print(answer.output_text)
