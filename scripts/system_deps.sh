#!/usr/bin/env bash
# The system programs the test suite runs, from the distribution's packages when one is missing:
# redis-server and redis-cli (tests start their own servers), headless Chromium (the dashboard
# test) and openssl (the Redis TLS test's certificates). Debian/Ubuntu (apt-get) only; elsewhere,
# or without root or sudo, it names what to install and exits 1.
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    sudo=(none)
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "${sudo[0]:-}" = "none" ]; then
    echo "error: the tests need these system packages: ${missing[*]}" >&2
    echo "hint: install them (Debian/Ubuntu: sudo apt-get install -y ${missing[*]}) and run again" >&2
    exit 1
fi
echo "installing system packages: ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
