#!/usr/bin/env bash
# Talk to `llmgw up` with curl (credentials from the state dir).
set -euo pipefail
STATE_DIR=${LLMGW_STATE_DIR:-.llmgw}
GATEWAY=$(python3 -c "import json;print(json.load(open('$STATE_DIR/credentials.json'))['gateway_url'])")
KEY=$(python3 -c "import json;print(json.load(open('$STATE_DIR/credentials.json'))['client_key'])")

curl -sS "$GATEWAY/chat/completions" \
  -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
  -d '{"model": "demo", "messages": [{"role": "user", "content": "hello from curl"}]}'
echo
