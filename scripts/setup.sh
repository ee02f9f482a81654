#!/usr/bin/env bash
# Install what umbp needs to build and test on Debian 12 (run as root, or with sudo).
# Safe to run again: installs only what is missing. python3-venv: Debian's
# python3 has no ensurepip without it, so `python3 -m venv` (scripts/setup-python.sh,
# the wheel suite) fails (tests/cli/check_setup.py checks the list).
set -euo pipefail
pkgs=(meson ninja-build pkg-config gcc clang libclang-rt-14-dev liburcu-dev libnuma-dev libhwloc-dev
      libcmocka-dev hwloc libdpdk-dev libmicrohttpd-dev libjansson-dev systemd python3 python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: build dependencies present" >&2
