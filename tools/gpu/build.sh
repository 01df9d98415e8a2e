#!/usr/bin/env bash
# Builds the GPU binaries here (no GPU needed) into .gpu/, small enough to carry to the
# device machine: weft (CLI), weft_gpu_tests and libweft_c.so (the Python package's library).
# No MPI (the device image's may differ).
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DWEFT_ENABLE_MPI=OFF > build-gpu.log
cmake --build build-gpu -j2 --target weft_cli weft_gpu_tests weft_c >> build-gpu.log
mkdir -p .gpu
cp build-gpu/weft build-gpu/tests/weft_gpu_tests build-gpu/libweft_c.so .gpu/
du -sh .gpu
