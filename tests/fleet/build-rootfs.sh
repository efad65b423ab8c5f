#!/bin/sh
# Build the Debian bookworm arm64 root filesystem of the emulated aarch64 board, once, into a cache folder.
#
#   sh tests/fleet/build-rootfs.sh DEST WHEELS
#
# DEST (e.g. /var/cache/edgemask-fleet/bookworm-arm64-<hash>) ends up as an extracted root filesystem with
# python3 (+ venv, pip), OpenSSH server and sftp, and a Raspberry Pi's runtimes installed system-wide from the
# aarch64 wheels in WHEELS (tests/fleet/fetch-wheels.sh), with the same pip lines `edgemask devices setup`
# runs on a Pi: WHEELS/requirements.txt's lines with their dependencies (numpy, onnxruntime, ai-edge-litert,
# torch, ...), then the lines after `--no-deps` without theirs (executorch). The fleet fixtures mount it
# read-only as the lower layer of an overlay, so each test session starts from the same clean board.
# Everything inside runs under qemu-user; a DEST holding `.complete` is reused as it is.
#
# Needs root, mmdebstrap, arch-test, qemu-user-static + binfmt_misc (tests/fleet/install.sh sets them up),
# a reachable Debian mirror and about 6 GB + the wheels' size free under DEST's parent.
set -eu
DEST="$1"
WHEELS="$2"
MIRROR="${EDGEMASK_FLEET_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3,python3-venv,python3-pip,openssh-server,openssh-sftp-server,procps,ca-certificates"

if [ -f "$DEST/.complete" ]; then
    echo "arm64 root filesystem already in $DEST"
    exit 0
fi
if ! arch-test arm64 >/dev/null 2>&1; then
    echo "this machine cannot run arm64 binaries: mount binfmt_misc and register qemu-user-static" >&2
    echo "(sh tests/fleet/install.sh does both), then rerun" >&2
    exit 2
fi
PARENT="$(dirname "$DEST")"
mkdir -p "$PARENT"
# the root filesystem takes 5.1 GB, and the wheels are copied into it while it is built
NEED_KB=$(( 6 * 1024 * 1024 + $(du -sk "$WHEELS" | cut -f1) ))
FREE_KB=$(df -Pk "$PARENT" | awk 'NR == 2 { print $4 }')
if [ "$FREE_KB" -lt "$NEED_KB" ]; then
    echo "$PARENT has $((FREE_KB / 1024)) MB free; building the arm64 root filesystem needs $((NEED_KB / 1024)) MB" >&2
    echo "(free some, or point EDGEMASK_FLEET_CACHE at a larger disk), then rerun" >&2
    exit 2
fi
TMP="$(mktemp -d "$PARENT/.partial.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

# A clean environment inside the chroot: the host's PIP_* variables and proxies name host paths.
IN="env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 QEMU_CPU=cortex-a72"
PIP="--quiet --no-index --break-system-packages --disable-pip-version-check --find-links /tmp/wheels"
# Placeholder host keys: openssh-server's postinst then skips generating keys, which under qemu takes minutes
# (RSA 3072); each stand-in gets its own key at start-up anyway.
KEYS='mkdir -p "$1/etc/ssh"; for t in rsa ecdsa ed25519; do touch "$1/etc/ssh/ssh_host_${t}_key"; done'
mmdebstrap --arch=arm64 --variant=minbase --include="$PACKAGES" \
    --essential-hook="$KEYS" \
    --customize-hook="mkdir -p \"\$1/tmp/wheels\"" \
    --customize-hook="copy-in $(ls "$WHEELS"/*.whl | tr '\n' ' ') /tmp/wheels" \
    --customize-hook="sed -n '1,/^--no-deps\$/p' \"$WHEELS/requirements.txt\" | grep -v '^--no-deps\$' > \"\$1/tmp/wheels/deps.txt\"" \
    --customize-hook="sed -n '/^--no-deps\$/,\$p' \"$WHEELS/requirements.txt\" | grep -v '^--no-deps\$' > \"\$1/tmp/wheels/nodeps.txt\"" \
    --customize-hook="chroot \"\$1\" $IN python3 -m pip install $PIP -r /tmp/wheels/deps.txt" \
    --customize-hook="chroot \"\$1\" $IN python3 -m pip install $PIP --no-deps -r /tmp/wheels/nodeps.txt" \
    --customize-hook="rm -rf \"\$1/tmp/wheels\" \"\$1\"/etc/ssh/ssh_host_*" \
    bookworm "$TMP/rootfs" "$MIRROR"
rm -rf "$DEST"
mv "$TMP/rootfs" "$DEST"
date -u +%FT%TZ > "$DEST/.complete"
echo "built $DEST ($(du -sh "$DEST" | cut -f1))"
