#!/usr/bin/env bash
# The two set-up commands of the README, on a fresh machine:
#   tools/dev.sh bench   install dependencies, build, run every `weft bench` (GPUs if present, else host)
#   tools/dev.sh test    install dependencies, build (and a host-only ASan/UBSan build), run every test
#                        (the first build's include tests/consumer/ against an install of it and as
#                        an add_subdirectory() subproject), then the Python tests (tests/python) in
#                        a virtual environment under build/ with the package installed host-only
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}

install_deps() {
  # python3-matplotlib: `weft trace --png` and the bench's plots. python3-venv, python3-pip: the
  # Python package's tests run in a virtual environment (the system Python stays clean).
  local pkgs=(cmake g++ make git libgtest-dev nlohmann-json3-dev libcli11-dev libfmt-dev libopenmpi-dev openmpi-bin
              python3-matplotlib python3-venv python3-pip)
  local missing=()
  for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "[dev.sh] installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  # Another apt (unattended upgrades on a fresh machine) may hold the locks: wait for it, up to
  # 10 minutes, rather than failing at once.
  local lock=(-o DPkg::Lock::Timeout=600)
  local i
  for i in $(seq 1 60); do
    $sudo apt-get "${lock[@]}" update -qq && break
    [ "$i" -eq 60 ] && { echo "[dev.sh] apt-get update failed for 10 minutes" >&2; exit 1; }
    echo "[dev.sh] apt-get update failed (another apt running?); retrying in 10 s" >&2
    sleep 10
  done
  DEBIAN_FRONTEND=noninteractive $sudo apt-get "${lock[@]}" install -y -qq "${missing[@]}" >/dev/null
}

build() {  # build DIR [cmake args...]
  local dir=$1
  shift
  echo "[dev.sh] configuring $dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
  echo "[dev.sh] building $dir ($JOBS jobs)"
  cmake --build "$dir" -j "$JOBS"
}

python_tests() {
  # The package installed into build/venv-py (host backend only: the Python layer is tested on
  # CPU tensors; the library's CUDA code is tested by the C++ suites), with pytest and torch
  # (from PyPI the first time, ~3 GB; a torch the system Python already has is reused).
  local venv=build/venv-py py
  [ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
  py=$venv/bin/python
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q pytest scikit-build-core
  "$py" -c "import torch" 2>/dev/null || { echo "[dev.sh] installing torch into $venv"; "$py" -m pip install -q torch; }
  echo "[dev.sh] installing the Python package (host backend) into $venv"
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$py" -m pip install -q . -C cmake.define.WEFT_ENABLE_CUDA=OFF -C cmake.define.WEFT_ENABLE_MPI=OFF \
    -C build-dir=build/py-build
  # From outside the source tree, so `import weft` is the installed package.
  (cd build && "../$py" -m pytest -q ../tests/python -p no:cacheprovider)
}

case "${1:-}" in
  bench)
    install_deps
    build build
    # Every benchmark: the device API and the collectives (`all`), then each GEMM +
    # communication op; the arguments (--quick, --out DIR) go to each.
    ./build/weft bench all "${@:2}"
    for op in ag_gemm gemm_rs gemm_ar; do ./build/weft bench "$op" "${@:2}"; done
    ;;
  test)
    install_deps
    build build
    (cd build && CMAKE_BUILD_PARALLEL_LEVEL=$JOBS ctest --output-on-failure --timeout 300)
    # Host code again under AddressSanitizer and UndefinedBehaviorSanitizer (no CUDA).
    build build-asan -DWEFT_SANITIZE=address,undefined -DWEFT_ENABLE_CUDA=OFF
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --timeout 300)
    python_tests
    ;;
  *)
    echo "usage: tools/dev.sh bench [--quick] | test" >&2
    exit 2
    ;;
esac
