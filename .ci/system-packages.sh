#!/usr/bin/env bash
# System programs the tests use beyond Python: `ip` (iproute2), `ping` and `arping` (the floating
# address's tests run them inside network namespaces), `promtool` (the alert rules), `chromium` (the
# console's browser tests), `openssl` (what a TLS listener offers), `sshd`/`ssh` (server add over ssh). Installs only what is missing, as root with apt-get (CI); elsewhere it says
# what is missing and leaves the rest to the tests' own skips.
set -euo pipefail

# promtool, for the alert rules' checks (tests/unit/test_alert_rules.py). Debian's `prometheus` package has it;
# only its promtool binary is taken (apt-get download + dpkg-deb: no server, no service, no user is installed),
# into /usr/local/bin as root, else into the virtualenv's bin.
if ! command -v promtool >/dev/null && [ ! -x .venv/bin/promtool ]; then
  if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
    dest=/usr/local/bin
    [ "$(id -u)" -eq 0 ] || dest="$PWD/.venv/bin"
    tmp=$(mktemp -d)
    if (cd "$tmp" && { apt-get download prometheus >/dev/null 2>&1 \
          || { [ "$(id -u)" -eq 0 ] && apt-get update -qq && apt-get download prometheus >/dev/null 2>&1; }; }); then
      dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool
      mkdir -p "$dest" && install -m 0755 "$tmp/usr/bin/promtool" "$dest/promtool"
    else
      echo "note: could not download Debian's prometheus package: install promtool for the alert rules' tests" >&2
    fi
    rm -rf "$tmp"
  else
    echo "note: no apt-get: install promtool (Prometheus) for the alert rules' tests" >&2
  fi
fi

need=()
command -v ip >/dev/null || need+=(iproute2)
command -v ping >/dev/null || need+=(iputils-ping)
command -v arping >/dev/null || need+=(iputils-arping)
# openssl's s_client asks a TLS listener what it offers (tests/integration/test_tls_policy.py).
command -v openssl >/dev/null || need+=(openssl)
# Debian's chromium, for the console's browser tests (Playwright drives /usr/bin/chromium; no `playwright install`).
[ -x /usr/bin/chromium ] || need+=(chromium)
# Debian's openssh-server (and its client, ssh/scp/ssh-keygen): `llmgw server add` is tested against a real
# sshd the test starts in a network namespace of its own (tests/integration/test_server_add_ssh.py).
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: missing ${need[*]} (not root, or no apt-get): install them for the floating-address and browser tests" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; }
