#!/bin/sh
# Install and switch on what the test fleet needs; idempotent, quick when everything is there.
# Called by scripts/test.sh (as root) before the test suite; needs root (or sudo) and a reachable apt mirror.
#
#   - OpenSSH server and client: every stand-in device is a real sshd
#   - iproute2, nftables: network namespaces, veth pairs, tc tbf rate limits, random packet loss
#   - mmdebstrap, arch-test, qemu-user-static, binfmt-support: the Debian bookworm arm64 board, run under
#     qemu-user; binfmt_misc must be mounted and qemu-aarch64 registered (after every boot, so checked each time)
#
# The arm64 root filesystem itself is built by the tests on first use (tests/fleet/build-rootfs.sh, 3-5 min)
# and cached under /var/cache/edgemask-fleet.
set -eu
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

missing=""
for tool in /usr/sbin/sshd ssh-keygen ip tc nft unshare mmdebstrap arch-test qemu-aarch64-static update-binfmts; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if [ -n "$missing" ]; then
    echo "test fleet: installing packages (missing:$missing)"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends openssh-server openssh-client iproute2 nftables \
        util-linux mmdebstrap arch-test qemu-user-static binfmt-support ca-certificates
fi
$SUDO mkdir -p /run/sshd

# binfmt_misc: lets the kernel hand arm64 binaries to qemu-aarch64-static (flag F: works inside a chroot)
if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    $SUDO mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || \
        echo "test fleet: cannot mount binfmt_misc; the aarch64 stand-in will not run" >&2
fi
if [ -e /proc/sys/fs/binfmt_misc/status ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    $SUDO update-binfmts --enable qemu-aarch64 || \
        echo "test fleet: cannot register qemu-aarch64 with binfmt_misc" >&2
fi
echo "test fleet ready: $(/usr/sbin/sshd -V 2>&1 | head -1 || true); arm64: $(arch-test arm64 2>&1 || true)"
