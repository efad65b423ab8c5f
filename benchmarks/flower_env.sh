# Creates .venv-flower (gitignored) for benchmarks/bench_flower.py: Flower's simulation engine (Ray) next to this
# package, kept out of .venv and out of pyproject.toml so the project's own environment never carries Ray.
#
#   bash benchmarks/flower_env.sh && .venv-flower/bin/python benchmarks/bench_flower.py [--rounds N] [--models mlp,cnn]
#
# A stamp skips the install when this script and pyproject.toml are unchanged since the last one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-flower"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
# flwr 1.42.0 requires certifi>=2026.10.19, a release PyPI does not have (newest: 2026.10.18), so it cannot
# install; 1.41.0 has the same Message API (flwr.serverapp.strategy.FedAvg, run_simulation) and the same Ray pin
# (ray==2.55.1 through the simulation extra).
FLWR="${FLWR:-1.41.0}"
STAMP="$VENV/.flower-installed"
HASH="$( (cat "${BASH_SOURCE[0]}" "$ROOT/pyproject.toml"; echo "$FLWR") | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then exit 0; fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "flower_env: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
echo "flower_env: installing Flower $FLWR (simulation: Ray) into $VENV (first time: a few minutes)" >&2
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch pinned as in pyproject.toml: an unpinned torch would pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q "torch==2.13.0" "flwr[simulation]==$FLWR" psutil
"$VENV/bin/python" -m pip install -q -e "$ROOT"  # no extras: neither tflite nor test
echo "$HASH" > "$STAMP"
