#!/usr/bin/env bash
# The main job, from a fresh Debian machine: install what is missing, build, and train the CNN
# on Fashion-MNIST (3 epochs, then the test set). Extra arguments go to the example, e.g.
#   scripts/run-example.sh --model mlp --max-epochs 1
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --main-job   # the library's and the example's packages only: no test tools or peers
# Tests off: their configure step needs GoogleTest and Python, which training does not. (A later
# scripts/test.sh turns them on again in the same build folder.)
VOLT_BUILD_TARGET=fashion_mnist scripts/build.sh -DVOLT_BUILD_TESTS=OFF
exec build/examples/fashion_mnist --default-root-dir runs/fashion_mnist "$@"
