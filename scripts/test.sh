#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: install what is missing, build everything,
# run every test (unit, end-to-end, Python interop, benchmark smoke) with CTest. Formatting is
# checked before the build (scripts/check-format.sh), clang-tidy runs after it (check-tidy.sh,
# VOLT_TIDY=0 skips it). Where the CUDA toolkit is installed, the CUDA build runs beside the CPU
# tests (scripts/build-cuda.sh, upstream LibTorch 2.15) of target torch_checks (every LibTorch-linked
# library, the example, the ddp probe, the unit tests of the version-sensitive areas) and the
# `compat`-labelled tests it built (unit, ddp, quick end-to-end), also beside them, which run on the
# CPU (*_CUDA tests skip without a GPU): they prove the compatibility headers' LibTorch 2.x side at run time, not
# only that it compiles. Each phase line says how long the run has taken so far.
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit   or   scripts/test.sh -LE slow
# VOLT_CUDA_BUILD=0 skips the CUDA build; =1 requires it.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
# phase NAME: says how long the run has taken when NAME ended (where CI's time goes), with the
# machine's load average: stop 23's CI took 1415 s for a build that takes about half that on a
# developer's machine of the same kind; these lines tell a busy or smaller machine from a slower build.
phase() {
  echo "test: $1 done, $(( $(date +%s) - started )) s since the start (load $(cut -d' ' -f1-3 /proc/loadavg))$(cache_note)"
}
# ccache's hits and misses since the start of this run (a warm cache should compile almost nothing:
# a build that misses shows it here), from its machine-readable counters.
ccache_counts() {
  ccache --print-stats 2>/dev/null | awk '$1 ~ /^(direct|preprocessed)_cache_hit$/ {h += $2} $1 == "cache_miss" {m += $2}
                                          END {print h + 0, m + 0}'
}
read -r hits_at_start misses_at_start < <(ccache_counts || echo "0 0")
cache_note() {
  command -v ccache >/dev/null || return 0
  local hits misses
  read -r hits misses < <(ccache_counts)
  echo ", ccache $(( hits - hits_at_start )) hits / $(( misses - misses_at_start )) misses"
}
echo "test: $(nproc) usable cores of $(grep -c ^processor /proc/cpuinfo), $(free -g | awk '/^Mem:/ {print $2}') GiB," \
     "load $(cut -d' ' -f1-3 /proc/loadavg)"
scripts/setup.sh
phase "setup"
scripts/check-format.sh   # seconds: an unformatted change fails before the build
# Release at -O2 without debug info: a clean build took 700 s instead of 982 s with
# RelWithDebInfo's -g (2 cores, ccache off); a build/ made by hand keeps whatever it was given.
# The LibTorch targets as unity builds (VOLT_UNITY_BUILD, cmake/VoltHelpers.cmake): ccache cannot
# cache a file compiled with the precompiled torch header, so on a clean checkout every one of them
# is compiled, and batches of 8 share LibTorch's templates.
scripts/build.sh -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DVOLT_UNITY_BUILD=ON \
  -DVOLT_BUILD_TESTS=ON
# After the build: clang-tidy reads its compile_commands.json and generated protobuf header.
[ "${VOLT_TIDY:-1}" = 0 ] || scripts/check-tidy.sh
phase "build and clang-tidy"
# The CUDA stage (see below) starts now, beside the CPU tests: its build from a warm ccache is some
# 100 s of CPU, mostly linking (a clean clone, 2026-11-28), and its tests then run at once, filling
# the minutes the CPU tests leave the cores idle (processes starting, ranks waiting on each other,
# timeouts, SLURM's ticks). The build runs at nice 10: at nice 19 (stop 35) a cached build got
# almost no CPU beside the tests and ended 268 s after them; at nice 0 a build with cache misses
# held a core for 20 minutes and the CPU tests ran on the other. Its tests run at normal priority.
cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
cuda_build=
case "${VOLT_CUDA_BUILD:-auto}" in
  0) ;;
  auto) if [ -x "$cuda_root/bin/nvcc" ]; then cuda_build=yes; else
          echo "test: no CUDA toolkit at $cuda_root; skipping the CUDA build (VOLT_CUDA_BUILD=1 to require it)"
        fi ;;
  *) cuda_build=yes ;;
esac
if [ -n "$cuda_build" ]; then
  cuda_log=$(mktemp)
  (
    # Only what differs with the LibTorch (target torch_checks, tests labelled `compat`): a
    # torch-free target compiles the same against either LibTorch, and the CPU stage runs every
    # test already. No debug info and -O0: the stage proves that the code compiles and runs against
    # LibTorch 2.x, whose kernels are compiled already; optimising Volt's own code only adds build
    # time (trainer.cpp: 14 s at -O0 against 19 s at -O1). One job: the CPU tests hold the cores.
    VOLT_JOBS=1 VOLT_BUILD_DIR=build-cuda VOLT_BUILD_TARGET=torch_checks nice -n 10 scripts/build-cuda.sh \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG" -DVOLT_UNITY_BUILD=ON \
      -DVOLT_COMPAT_SUBSET=ON
    phase "CUDA build (beside the CPU tests)"
    # A unity build, and only the cases marked `compat` of the multi-process and end-to-end suites
    # (VOLT_COMPAT_SUBSET): one case per mechanism proves the compatibility headers on LibTorch 2.x;
    # the CPU stage runs every case of the same algorithms.
    cd build-cuda
    ctest --output-on-failure --timeout 900 -j 1 -L compat "$@"
    phase "CUDA-stage tests (beside the CPU tests)"
  ) >"$cuda_log" 2>&1 &
  cuda_pid=$!
fi
# The SLURM tests (label `slurm`) run as a ctest of their own beside the rest: for minutes they
# mostly wait (SLURM's 30 s signal tick, requeues, jobs that sleep per step), and in the main run
# each would hold one of its slots idle. Their output follows the main run's.
cpu_status=0
(
  cd "${VOLT_BUILD_DIR:-build}"
  slurm_log=$(mktemp)
  ctest --output-on-failure --timeout 900 -j 1 -L slurm "$@" >"$slurm_log" 2>&1 &
  slurm=$!
  main_status=0
  # Tests labelled `long` (minutes of training against a documented figure, e.g.
  # e2e_gpt_corpus_target) are run by hand: ctest -L long.
  ctest --output-on-failure --timeout 900 -j "${VOLT_TEST_JOBS:-2}" -LE "slurm|long" "$@" || main_status=$?
  slurm_status=0
  wait "$slurm" || slurm_status=$?
  echo "test: the SLURM tests (label slurm), run beside the others:"
  cat "$slurm_log" && rm -f "$slurm_log"
  [ "$main_status" = 0 ] && [ "$slurm_status" = 0 ]
) || cpu_status=$?
phase "CPU tests"
if [ -z "$cuda_build" ]; then
  exit "$cpu_status"
fi
cuda_status=0
wait "$cuda_pid" || cuda_status=$?
echo "test: the CUDA build and its tests, run beside the CPU tests:"
cat "$cuda_log" && rm -f "$cuda_log"
phase "CUDA stage"
[ "$cpu_status" = 0 ] || exit "$cpu_status"
exit "$cuda_status"
