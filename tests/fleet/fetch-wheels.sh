#!/bin/sh
# Download the aarch64 / CPython 3.11 wheels a Raspberry Pi 4 needs for every format (numpy, onnxruntime, a
# TFLite interpreter, the ExecuTorch runtime and the torch it links, and their dependencies) into a cache
# folder, once. The same folder seeds the arm64 root filesystem and is what
# `devices.setup.setup_device(..., wheels_dir=...)` uploads in the provisioning tests (the stand-in devices
# have no route out, so they cannot reach a package index themselves).
#
#   sh tests/fleet/fetch-wheels.sh DEST [PYTHON]
#
# The lists are the ones `devices.setup.pip_installs` gives a Pi with all three runtimes: REQS with their
# dependencies; NODEPS without (executorch's own requirements are export-time tools such as coremltools==9.0,
# which has no aarch64 wheel at all, so `pip install executorch` cannot succeed on a Pi).
# DEST gets the wheels plus a `requirements.txt` stamp; a DEST whose stamp matches is left alone.
set -eu
DEST="$1"
PY="${2:-python3}"
REQS="numpy==2.4.6
onnxruntime==1.31.1
ai-edge-litert==2.3.0
torch==2.13.0
flatbuffers==25.12.19
ruamel.yaml==0.19.1
tabulate==0.10.0"
NODEPS="executorch==1.5.1"
STAMP="$REQS
--no-deps
$NODEPS"
if [ -f "$DEST/requirements.txt" ] && [ "$(cat "$DEST/requirements.txt")" = "$STAMP" ]; then
    echo "wheels already in $DEST"
    exit 0
fi
mkdir -p "$DEST"
TMP="$(mktemp -d "$DEST/.partial.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
echo "$REQS" > "$TMP/requirements.in"
echo "$NODEPS" > "$TMP/nodeps.in"
# --platform: Debian bookworm has glibc 2.36, so any manylinux up to 2_36 for aarch64 runs there (pip takes
# each tag literally: torch's nvidia-nccl-cu13 is tagged 2_18 only, cuda-bindings 2_24, nvidia-cupti 2_25).
PLATFORMS="--platform manylinux2014_aarch64 --platform any"
for v in 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36; do
    PLATFORMS="$PLATFORMS --platform manylinux_2_${v}_aarch64"
done
download() {
    # shellcheck disable=SC2086
    "$PY" -m pip download --quiet --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
        --abi abi3 --abi none $PLATFORMS -d "$TMP" "$@"
}
download -r "$TMP/requirements.in"
download --no-deps -r "$TMP/nodeps.in"
rm -f "$DEST"/*.whl  # wheels of an older stamp
mv "$TMP"/*.whl "$DEST"/
echo "$STAMP" > "$DEST/requirements.txt"
ls "$DEST"
