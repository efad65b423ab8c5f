#!/bin/sh
# Install the OpenSSH server and client that the fleet tests start as stand-in devices.
# Called by .ci/run before the test suite; needs root (or sudo) and a reachable apt mirror.
set -eu
if [ -x /usr/sbin/sshd ] && command -v ssh-keygen >/dev/null 2>&1 && command -v ssh-keyscan >/dev/null 2>&1; then
    echo "openssh-server already installed: /usr/sbin/sshd"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends openssh-server openssh-client
$SUDO mkdir -p /run/sshd
echo "installed: $(/usr/sbin/sshd -V 2>&1 | head -1 || true)"
