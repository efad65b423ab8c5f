#!/usr/bin/env bash
# The main job on embedded defaults: set up .venv if needed, then `edgemask demo` (extra args pass through,
# e.g. --workspace DIR).
EXTRAS=""  # the demo needs no extra (no TFLite converter, no test tools)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec edgemask demo "$@"
