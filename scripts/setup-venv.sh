#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install kb_gym with everything it needs.
# Sourced by scripts/demo.sh and scripts/test.sh. A second run only checks a stamp and returns.
#
# PyTorch: on a machine with an NVIDIA GPU, pip's default (CUDA) build. Without one, the CPU build:
# from the PyTorch CPU index when it is reachable, else torch==2.13.0, which pip resolves to a local
# CPU wheel where the machine provides one (as our development and CI machines do).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${KB_GYM_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
CPU_TORCH=${KB_GYM_CPU_TORCH:-torch==2.13.0}

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
  echo "kb_gym needs Python 3.11 or newer; $PYTHON is $("$PYTHON" --version 2>&1)" >&2; exit 1; }

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp="$VENV/.kb_gym-installed"
want=$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup-venv.sh" | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import kb_gym, torch" 2>/dev/null; then
  return 0 2>/dev/null || exit 0
fi

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] NVIDIA GPU found: installing PyTorch (CUDA build)"
    "${PIP[@]}" install torch
  elif command -v curl >/dev/null 2>&1 && curl -fsS -m 5 -o /dev/null https://download.pytorch.org/whl/cpu/; then
    echo "[setup] no GPU: installing the CPU build of PyTorch from download.pytorch.org"
    "${PIP[@]}" install torch --index-url https://download.pytorch.org/whl/cpu
  else
    echo "[setup] no GPU and no PyTorch CPU index: installing $CPU_TORCH"
    "${PIP[@]}" install "$CPU_TORCH"
  fi
fi
echo "[setup] installing kb_gym (editable) and its dependencies into $VENV"
"${PIP[@]}" install -e "$ROOT[dev]" 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import kb_gym, torch, triton, gymnasium" || { echo "[setup] install failed" >&2; exit 1; }
echo "$want" > "$stamp"
