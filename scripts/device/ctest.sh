#!/usr/bin/env bash
# CTest's device_pack test (tests/CMakeLists.txt): the cheap part of the prepared GPU check (#33).
#   scripts/device/ctest.sh BUILD_DIR
# 1. pack.sh into BUILD_DIR/device-pack (~4 s: one apt-cache query, apt's cache or apt-get download),
#    failing when the pack and the working tree exceed the run tool's 64 MiB;
# 2. where setup's torch 2.15 and a CUDA toolkit are present, check.sh --dry-run's configure against
#    the unpacked prefix with the system's copies of those packages hidden from CMake (~20 s; its
#    build target is CMake's own rebuild_cache, so nothing compiles and every check skips).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: scripts/device/ctest.sh BUILD_DIR}
export VOLT_DEVICE_PACK=$build/device-pack
scripts/device/pack.sh
torch=${VOLT_TORCHRUN_PYTHONPATH:-/opt/volt/python-torchrun}
if [ ! -d "$torch/torch" ] || [ ! -x "${CUDAToolkit_ROOT:-/usr/local/cuda}/bin/nvcc" ]; then
  echo "device_pack: no torch 2.15 at $torch or no nvcc: the dry run's configure is left out"
  exit 0
fi
OUT=$build/device-dry-out VOLT_DEVICE_BUILD=$build/device-dry VOLT_DEVICE_TARGETS=rebuild_cache \
  scripts/device/check.sh --dry-run 2>&1 | grep -v -e 'Failed to initialize NumPy' -e '_conversion_method_template'
