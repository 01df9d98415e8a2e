#!/usr/bin/env bash
# The two set-up commands of the README, on a fresh machine:
#   tools/dev.sh bench   install dependencies, build, run `weft bench` (GPUs if present, else host)
#   tools/dev.sh test    install dependencies, build (and a host-only ASan/UBSan build), run every test
#                        (the first build's include tests/consumer/ against an install of it and as
#                        an add_subdirectory() subproject)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}

install_deps() {
  local pkgs=(cmake g++ make git libgtest-dev nlohmann-json3-dev libcli11-dev libfmt-dev libopenmpi-dev openmpi-bin)
  local missing=()
  for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "[dev.sh] installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

build() {  # build DIR [cmake args...]
  local dir=$1
  shift
  echo "[dev.sh] configuring $dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
  echo "[dev.sh] building $dir ($JOBS jobs)"
  cmake --build "$dir" -j "$JOBS"
}

case "${1:-}" in
  bench)
    install_deps
    build build
    ./build/weft bench "${@:2}"
    ;;
  test)
    install_deps
    build build
    (cd build && CMAKE_BUILD_PARALLEL_LEVEL=$JOBS ctest --output-on-failure --timeout 300)
    # Host code again under AddressSanitizer and UndefinedBehaviorSanitizer (no CUDA).
    build build-asan -DWEFT_SANITIZE=address,undefined -DWEFT_ENABLE_CUDA=OFF
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --timeout 300)
    ;;
  *)
    echo "usage: tools/dev.sh bench [--quick] | test" >&2
    exit 2
    ;;
esac
