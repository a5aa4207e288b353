#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: install what is missing, build everything,
# run every test (unit, end-to-end, Python interop, benchmark smoke) with CTest. Formatting is
# checked before the build (scripts/check-format.sh), clang-tidy runs after it (check-tidy.sh,
# VOLT_TIDY=0 skips it). Then, where the CUDA toolkit is installed, the CUDA build
# (scripts/build-cuda.sh, upstream LibTorch 2.15) of target torch_checks (every LibTorch-linked
# library, the example, the ddp probe, the unit tests of the version-sensitive areas) and the
# `torch`-labelled tests it built (unit, ddp, quick end-to-end), which run on the CPU (*_CUDA tests
# skip without a GPU): they prove the compatibility headers' LibTorch 2.x side at run time, not
# only that it compiles.
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit   or   scripts/test.sh -LE slow
# VOLT_CUDA_BUILD=0 skips the CUDA build; =1 requires it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/check-format.sh   # seconds: an unformatted change fails before the build
# Release at -O2 without debug info: a clean build took 700 s instead of 982 s with
# RelWithDebInfo's -g (2 cores, ccache off); a build/ made by hand keeps whatever it was given.
scripts/build.sh -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG"
# After the build: clang-tidy reads its compile_commands.json and generated protobuf header.
[ "${VOLT_TIDY:-1}" = 0 ] || scripts/check-tidy.sh
(cd "${VOLT_BUILD_DIR:-build}" && ctest --output-on-failure --timeout 900 -j "${VOLT_TEST_JOBS:-2}" "$@")

cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
case "${VOLT_CUDA_BUILD:-auto}" in
  0) exit 0 ;;
  auto) if [ ! -x "$cuda_root/bin/nvcc" ]; then
          echo "test: no CUDA toolkit at $cuda_root; skipping the CUDA build (VOLT_CUDA_BUILD=1 to require it)"
          exit 0
        fi ;;
esac
# Only what differs with the LibTorch (target torch_checks, tests labelled `torch`): the CUDA stage
# is the longest part of CI, and a torch-free target compiles the same against either LibTorch.
# No debug info and -O1: the stage proves that the code compiles and runs against LibTorch 2.x;
# debug info and full optimisation would only add build time to CI's longest stage.
VOLT_BUILD_DIR=build-cuda VOLT_BUILD_TARGET=torch_checks scripts/build-cuda.sh \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG"
cd build-cuda
ctest --output-on-failure --timeout 900 -j "${VOLT_TEST_JOBS:-2}" -L torch -LE slow "$@"
