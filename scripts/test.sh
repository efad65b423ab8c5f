#!/usr/bin/env bash
# The test suite: set up .venv if needed, install the stand-in devices' prerequisites (OpenSSH, qemu-user, mmdebstrap, nftables) when
# running as root, lint with ruff, then pytest. Extra args pass to pytest, e.g. -m "not slow and not fleet" for a quick loop.
EXTRAS="test,tflite,flower"  # test tools, the TFLite converter so every format is tested in its runtime, Flower + Ray
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
if [ "$(id -u)" = 0 ]; then
  sh tests/fleet/install.sh  # idempotent: packages once, binfmt_misc after each boot
fi
ruff check --quiet .  # the rule set in pyproject.toml's [tool.ruff.lint]
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "edgemask: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
