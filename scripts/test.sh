#!/usr/bin/env bash
# Install (scripts/bootstrap.sh, plus the system programs the tests run: scripts/system_deps.sh)
# and run the whole CPU test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system_deps.sh
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -q "$@"
