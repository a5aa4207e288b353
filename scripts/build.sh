#!/usr/bin/env bash
# Configures and builds Volt into ${VOLT_BUILD_DIR:-build} (Release unless -DCMAKE_BUILD_TYPE says otherwise, Ninja,
# ccache). Extra arguments go to CMake's configure step, e.g. -DCMAKE_PREFIX_PATH=/opt/libtorch.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${VOLT_BUILD_DIR:-build}
jobs=${VOLT_JOBS:-$(nproc)}
start=$(date +%s)
cmake -S . -B "$build_dir" -G Ninja "$@" >/dev/null
cmake --build "$build_dir" -j "$jobs" ${VOLT_BUILD_TARGET:+--target "$VOLT_BUILD_TARGET"}
echo "build: done in $(( $(date +%s) - start )) s ($build_dir)"
