#!/usr/bin/env bash
# Quickstart 2: set up (first run only), lint, and run the test suite. GPU tests skip without a GPU.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/setup-venv.sh"
cd "$ROOT"
"$VENV/bin/ruff" check .
# pytest exits 5 when it collects nothing; set -e turns that into a failure too.
"$VENV/bin/python" -m pytest -q "$@"
