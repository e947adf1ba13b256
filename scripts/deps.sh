#!/usr/bin/env bash
# Installs the Debian packages nbdflow needs, when they are missing.
# Usage: scripts/deps.sh build|demo|valgrind|test|all
#   build: to build nbdflow (its libraries come with it);
#   demo: that and what scripts/demo.sh runs besides coreutils;
#   valgrind: that and valgrind (tests/valgrind);
#   test, all: everything the test suite and the benchmarks use.
# As root it runs apt-get; otherwise it prints the exact command to run.
set -euo pipefail

build_pkgs=(gcc meson ninja-build pkg-config libgnutls28-dev nettle-dev
            libxxhash-dev zlib1g-dev libzstd-dev)
test_pkgs=(python3 nbdkit libnbd-bin qemu-utils nbd-server gnutls-bin
           iproute2 iputils-ping iperf3 procps strace time util-linux
           e2fsprogs clang libclang-rt-14-dev)
demo_pkgs=(python3)

case "${1:-all}" in
  build) want=("${build_pkgs[@]}") ;;
  demo) want=("${build_pkgs[@]}" "${demo_pkgs[@]}") ;;
  valgrind) want=("${build_pkgs[@]}" "${test_pkgs[@]}" valgrind) ;;
  test|all) want=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
  *) echo "usage: $0 build|demo|valgrind|test|all" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "nbdflow: missing packages: ${missing[*]}" >&2
  echo "run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "nbdflow: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
