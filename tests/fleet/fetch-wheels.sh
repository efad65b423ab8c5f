#!/bin/sh
# Download the aarch64 / CPython 3.11 wheels an emulated board needs (numpy, onnxruntime and their
# dependencies) into a cache folder, once. The same folder seeds the arm64 root filesystem and is what
# `devices.setup.setup_device(..., wheels_dir=...)` uploads in the provisioning tests (the stand-in devices
# have no route out, so they cannot reach a package index themselves).
#
#   sh tests/fleet/fetch-wheels.sh DEST [PYTHON]
#
# DEST gets the wheels plus a `requirements.txt` stamp; a DEST whose stamp matches is left alone.
set -eu
DEST="$1"
PY="${2:-python3}"
REQS="numpy==2.4.6
onnxruntime==1.31.1"
if [ -f "$DEST/requirements.txt" ] && [ "$(cat "$DEST/requirements.txt")" = "$REQS" ]; then
    echo "wheels already in $DEST"
    exit 0
fi
mkdir -p "$DEST"
TMP="$(mktemp -d "$DEST/.partial.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
echo "$REQS" > "$TMP/requirements.in"
# --platform: Debian bookworm has glibc 2.36, so any manylinux up to 2_36 for aarch64 runs there.
"$PY" -m pip download --quiet --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
    --abi abi3 --abi none --platform manylinux_2_28_aarch64 --platform manylinux_2_27_aarch64 \
    --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 --platform any \
    -d "$TMP" -r "$TMP/requirements.in"
mv "$TMP"/*.whl "$DEST"/
echo "$REQS" > "$DEST/requirements.txt"
ls "$DEST"
