#!/usr/bin/env bash
# Install (scripts/bootstrap.sh) and run the whole CPU test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -q "$@"
