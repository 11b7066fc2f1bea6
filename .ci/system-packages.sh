#!/usr/bin/env bash
# System programs the tests use beyond Python: `ip` (iproute2), `ping` and `arping` (the floating
# address's tests run them inside network namespaces). Installs only what is missing, as root with
# apt-get (CI); elsewhere it says what is missing and leaves the rest to the tests' own skips.
set -euo pipefail
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v ping >/dev/null || need+=(iputils-ping)
command -v arping >/dev/null || need+=(iputils-arping)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: missing ${need[*]} (not root, or no apt-get): install them for the floating-address tests" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; }
