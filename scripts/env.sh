# Sourced by demo.sh and test.sh: create .venv if missing and install edgemask into it when pyproject.toml
# changed since the last install (a stamp file holds its hash). Uses the machine's python3.11.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x "$VENV/bin/python" ]; then
  echo "edgemask: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.edgemask-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)-${EDGEMASK_EXTRAS:-test}"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "edgemask: installing into $VENV (first time: about 1-2 minutes)" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # torch is pinned to 2.13.0 in pyproject.toml: an unpinned torch would pull a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install -q -e "$ROOT[${EDGEMASK_EXTRAS:-test}]"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
