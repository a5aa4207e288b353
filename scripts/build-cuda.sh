#!/usr/bin/env bash
# Builds Volt against an upstream CUDA LibTorch: the `torch` wheel from PyPI, which carries
# include/, lib/ and a CMake config, with this machine's CUDA toolkit (nvcc, cuDNN, NCCL).
#
#   scripts/build-cuda.sh                 # everything, into build-cuda/
#   VOLT_BUILD_TARGET=volt_trainer scripts/build-cuda.sh   # only the library (`volt` is the CLI tool)
#
# It needs no GPU: it proves that ProcessGroupNCCL, the CUDA paths of dp/ddp/precision and the
# *_CUDA tests compile and link. On a GPU machine, run the tests it built:
#   build-cuda/src/volt/trainer/trainer_cuda_test --gtest_filter='*_CUDA'
#
# Versions are pinned. torch 2.15.0's wheel links CUDA 13 (libcudart.so.13), which matches the
# toolkit here (CUDA 13.0 under /usr/local/cuda). Libraries libtorch_cuda.so links that this
# toolkit lacks (cuFile, cuSPARSELt, NVSHMEM) or has too old (its NCCL 2.28 has no ncclCommGrow, ...)
# come from the NVIDIA wheels torch 2.15.0 itself requires, laid out as pip installs them.
set -euo pipefail
cd "$(dirname "$0")/.."

torch_version=${VOLT_CUDA_TORCH_VERSION:-2.15.0}
cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
build_dir=${VOLT_BUILD_DIR:-build-cuda}

if [ ! -x "$cuda_root/bin/nvcc" ]; then
  echo "build-cuda: no CUDA toolkit at $cuda_root (expected $cuda_root/bin/nvcc). HINT: install the CUDA" \
       "toolkit 13.x or set CUDAToolkit_ROOT to its folder." >&2
  exit 2
fi

scripts/setup.sh  # the CPU build's dependencies: the same Debian libraries (fmt, CLI11, protobuf, ...)

if [ -z "${VOLT_CUDA_TORCH_HOME:-}" ] && [ "$torch_version" = 2.15.0 ]; then
  # setup.sh pip-installed this torch with these NVIDIA wheels for the torchrun test, in pip's
  # layout: build against that copy rather than download the 1 GB wheel a second time (CI time).
  home=${VOLT_TORCHRUN_PYTHONPATH:-/opt/volt/python-torchrun}
else
  home=${VOLT_CUDA_TORCH_HOME:-/opt/volt/libtorch-$torch_version-cu13}
  # Libraries libtorch_cuda.so and libtorch_nvshmem.so need that the CUDA toolkit lacks or has too
  # old; these versions are torch 2.15.0's, the versions another torch needs may differ.
  link_only_wheels=(nvidia-cufile==1.17.1.22 nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2
                    nvidia-nccl-cu13==2.30.7)
  stamp="pip-layout torch==$torch_version ${link_only_wheels[*]}"
  if [ "$(cat "$home/.complete" 2>/dev/null)" != "$stamp" ]; then
    echo "build-cuda: fetching torch==$torch_version (CUDA 13) into $home"
    wheels=$(mktemp -d)
    trap 'rm -rf "$wheels"' EXIT
    platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_18_x86_64
               --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.11 \
      --implementation cp "${platforms[@]}" -d "$wheels" "torch==$torch_version" "${link_only_wheels[@]}"
    rm -rf "$home" && mkdir -p "$home"
    # pip's layout, torch/ beside nvidia/<package>/lib: libtorch_cuda.so finds those libraries
    # through its RPATH ($ORIGIN/../../nvidia/nccl/lib, ...), at link time and at run time.
    unzip -q "$wheels"/torch-*.whl 'torch/include/*' 'torch/lib/*' 'torch/share/*' -d "$home"
    for wheel in "$wheels"/nvidia_*.whl; do
      unzip -q -o "$wheel" 'nvidia/*/lib/*' -d "$home"
    done
    echo "$stamp" >"$home/.complete"
  fi
fi
# libcaffe2_nvrtc.so links the driver (libcuda.so.1), which a machine without a GPU lacks: the
# toolkit's stub stands in for it at link time only (never at run time, where it would hide a
# real driver).
mkdir -p "$build_dir/driver-stub"
driver_stub=$(realpath "$build_dir/driver-stub")
ln -sf "$cuda_root/lib64/stubs/libcuda.so" "$driver_stub/libcuda.so.1"

start=$(date +%s)
# TorchConfig.cmake looks for c10 with find_library, which prefers the system folders: with
# Debian's libtorch-dev installed it would link Debian's libc10.so. Name the wheel's.
cmake -S . -B "$build_dir" -G Ninja \
  -DCMAKE_PREFIX_PATH="$home/torch/share/cmake" \
  -DTorch_DIR="$home/torch/share/cmake/Torch" \
  -Dc10_LIBRARY="$home/torch/lib/libc10.so" \
  -DCUDAToolkit_ROOT="$cuda_root" \
  -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc" \
  -DVOLT_LINK_ONLY_LIBRARY_DIRS="$(ls -d "$home"/nvidia/*/lib | tr '\n' ';')$driver_stub" \
  "$@" >/dev/null
cmake --build "$build_dir" -j "${VOLT_JOBS:-$(nproc)}" ${VOLT_BUILD_TARGET:+--target "$VOLT_BUILD_TARGET"}
echo "build-cuda: done in $(( $(date +%s) - start )) s ($build_dir, torch $torch_version, CUDA at $cuda_root)"
