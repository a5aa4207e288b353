#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: install what is missing, build everything,
# run every test (unit, end-to-end, Python interop, benchmark smoke) with CTest.
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit   or   scripts/test.sh -LE slow
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd "${VOLT_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j "${VOLT_TEST_JOBS:-2}" "$@"
