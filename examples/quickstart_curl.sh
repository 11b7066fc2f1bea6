#!/usr/bin/env bash
# Talk to `llmgw up` with curl (URL and key from the state dir's credentials.json).
set -euo pipefail

creds=${LLMGW_STATE_DIR:-.llmgw}/credentials.json   # written by `llmgw up`
GATEWAY=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["gateway_url"])' "$creds")
KEY=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["client_key"])' "$creds")

curl -sS "$GATEWAY/chat/completions" \
  -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
  -d '{"model": "demo", "messages": [{"role": "user", "content": "hello from curl"}]}'
echo
