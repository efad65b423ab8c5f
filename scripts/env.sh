# Sourced by demo.sh and test.sh: create .venv if missing and install edgemask into it with the extras the
# caller wants (EXTRAS), unless a stamp says this pyproject.toml is already installed with them.
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
HASH="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
HAVE=""
if [ -f "$STAMP" ] && [ "$(head -1 "$STAMP")" = "$HASH" ]; then HAVE="$(sed -n 2p "$STAMP")"; fi
# the extras wanted now, plus those already installed for this pyproject.toml (never uninstall an extra)
ALL="$(printf '%s\n' ${EXTRAS//,/ } ${HAVE//,/ } | sort -u | paste -sd, -)"
if [ ! -f "$STAMP" ] || [ "$(head -1 "$STAMP")" != "$HASH" ] || [ "$ALL" != "$HAVE" ]; then
  echo "edgemask: installing into $VENV${ALL:+ with extras [$ALL]} (first time: a few minutes)" >&2
  # pip's own messages go to a log beside the venv; shown only when the install fails.
  # torch is pinned to 2.13.0 in pyproject.toml: an unpinned torch would pull a multi-GB CUDA build.
  LOG="$VENV/install.log"
  if ! { "$VENV/bin/python" -m pip install -q --upgrade pip \
         && "$VENV/bin/python" -m pip install -q -e "$ROOT${ALL:+[$ALL]}"; } > "$LOG" 2>&1; then
    echo "edgemask: installing into $VENV failed; the end of $LOG:" >&2
    tail -n 25 "$LOG" >&2
    exit 1
  fi
  printf '%s\n%s\n' "$HASH" "$ALL" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
