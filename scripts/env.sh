# Sourced by demo.sh and test.sh: create .venv if missing and install edgemask into it with the extras the
# caller wants (EXTRAS), unless a stamp says this pyproject.toml is already installed with them.
#
# Which Python: an existing .venv keeps its own. A new one is made with $PYTHON when set, else with the newest
# supported python3.x on the PATH that actually runs (a pyenv shim for a version that is not selected is on the
# PATH but fails). EDGEMASK_VENV=DIR puts the environment elsewhere (a second one, for another Python).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EDGEMASK_VENV:-$ROOT/.venv}"
# The versions pyproject.toml's requires-python admits (tests/test_python_versions.py keeps the two in step).
SUPPORTED="3.11 3.12 3.13"
WORKS="Python ${SUPPORTED// /, }"
WORKS="${WORKS%, *} or ${WORKS##*, }"  # "Python 3.11, 3.12 or 3.13"

# "3.12.1" when $1 runs, "" when it is missing or fails.
py_version() { "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || true; }
is_supported() { case " $SUPPORTED " in *" ${1%.*} "*) return 0 ;; *) return 1 ;; esac; }

if [ -n "${PYTHON:-}" ]; then  # refused here, before anything is created or installed
  PYVER="$(py_version "$PYTHON")"
  if [ -z "$PYVER" ]; then
    echo "edgemask: PYTHON=$PYTHON does not run; edgemask needs $WORKS" >&2
    exit 1
  fi
  if ! is_supported "$PYVER"; then
    echo "edgemask: PYTHON=$PYTHON is Python $PYVER; edgemask needs $WORKS" >&2
    exit 1
  fi
fi

if [ -x "$VENV/bin/python" ]; then
  VER="$(py_version "$VENV/bin/python")"
  if [ -z "$VER" ]; then
    echo "edgemask: $VENV/bin/python does not run (its Python was removed?); remove $VENV and run again" >&2
    exit 1
  fi
  if ! is_supported "$VER"; then
    echo "edgemask: $VENV has Python $VER; edgemask needs $WORKS: remove $VENV and run again" >&2
    exit 1
  fi
  if [ -n "${PYTHON:-}" ] && [ "${PYVER%.*}" != "${VER%.*}" ]; then
    echo "edgemask: $VENV has Python $VER, not PYTHON=$PYTHON's $PYVER; remove $VENV," \
         "or set EDGEMASK_VENV=DIR for a second environment" >&2
    exit 1
  fi
  echo "edgemask: Python $VER, in $VENV" >&2
else
  if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON" VER="$PYVER" WHY="PYTHON=$PYTHON"
  else
    PY="" VER="" TRIED="" NEWEST=-1 CANDS=""
    for v in $SUPPORTED; do CANDS="python$v $CANDS"; done
    # newest first; python3 last, for a machine whose python3 has no python3.x name of its own
    for cand in $CANDS python3; do
      v="$(py_version "$cand")"
      TRIED="$TRIED, $cand${v:+ ($v)}"
      minor="${v#3.}" && minor="${minor%%.*}"
      if [ -n "$v" ] && is_supported "$v" && [ "$minor" -gt "$NEWEST" ]; then
        PY="$cand" VER="$v" NEWEST="$minor"
      fi
    done
    if [ -z "$PY" ]; then
      echo "edgemask: no $WORKS runs here (tried ${TRIED#, }); install one, or set PYTHON=" >&2
      exit 1
    fi
    WHY="$PY, the newest of ${SUPPORTED// /, } that runs here"
  fi
  echo "edgemask: creating $VENV with Python $VER ($WHY)" >&2
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
