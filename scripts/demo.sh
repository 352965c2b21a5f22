#!/usr/bin/env bash
# Quickstart 1: set up (first run only) and run the demo on the built-in problems (GPU if present).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/setup-venv.sh"
exec "$VENV/bin/kb-gym" demo "$@"
