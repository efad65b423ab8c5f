#!/bin/sh
# Start one stand-in device's sshd. Run by tests/fleet/fleet.py as
#
#   ip netns exec NETNS unshare --mount --propagation private sh boot-device.sh DIR [LOWER]
#
# so everything mounted here lives in the device's own mount namespace and vanishes with its sshd.
#   DIR    the device's host-side folder (fleet.py wrote sshd_config, keys, cpuinfo and the sysfs tree there)
#   LOWER  an arm64 root filesystem (tests/fleet/build-rootfs.sh): the device then runs in a chroot on an
#          overlay of it (writes go to DIR/upper), its binaries under qemu-user via binfmt_misc.
# Without LOWER, the host's own sshd serves the device (an x86_64 stand-in).
set -eu
DIR="$1"
LOWER="${2:-}"
if [ -z "$LOWER" ]; then
    mkdir -p /run/sshd  # privilege separation directory
    exec /usr/sbin/sshd -D -e -f "$DIR/sshd_config"
fi

ROOT="$DIR/merged"
mkdir -p "$ROOT" "$DIR/upper" "$DIR/work"
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$DIR/upper,workdir=$DIR/work" "$ROOT"
mount -t proc proc "$ROOT/proc"
# onnxruntime's cpuinfo library aborts on import when /proc/cpuinfo describes the x86 host: show an aarch64 one
mount --bind "$DIR/cpuinfo" "$ROOT/proc/cpuinfo"
mount --rbind /dev "$ROOT/dev"
mount -t sysfs sysfs "$ROOT/sys"
mount -t tmpfs -o mode=755 tmpfs "$ROOT/run"
mkdir -p "$ROOT/run/sshd" "$ROOT/emu-sysfs"
# EMULATED power sensors and board state, written by tests/fleet/powermodel.py on the host
mount --bind "$DIR/sysfs" "$ROOT/emu-sysfs"
# QEMU_CPU: without a named CPU qemu's default model makes inference about 25x slower
exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin QEMU_CPU=cortex-a72 \
    chroot "$ROOT" /usr/sbin/sshd -D -e -f /etc/ssh/edgemask/sshd_config
