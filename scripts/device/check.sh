#!/usr/bin/env bash
# The prepared GPU check (issue #33, docs/gpus.md "The prepared GPU check"): ONE command, run from
# the repository root on a lent GPU machine (Python's CUDA torch, nvcc, CMake, Ninja; no Debian
# -dev packages, no network), with the pack of scripts/device/pack.sh carried along:
#
#   scripts/device/check.sh              build against Python's torch and the pack, then run the checks
#   scripts/device/check.sh --dry-run    the same here, against the CUDA torch 2.15 setup installs in
#                                        /opt/volt/python-torchrun, the GPU checks skipped with their reason
#
# 1. unpacks the pack's .debs into a prefix under the build folder (dpkg-deb -x, else ar + tar;
#    never into /),
# 2. configures Volt against torch.utils.cmake_prefix_path and that prefix (protoc, pkg-config and
#    the CMake packages from it), builds only the targets the checks run, with all cores,
# 3. runs every check under its own `timeout`; a failing check does not stop the others.
# Writes $OUT/report.md (one row per check: pass / fail / skip with the reason, and its figures),
# $OUT/build.log and $OUT/checks.log (3 files; the run tool brings back at most 8). Exits non-zero
# when the build or any check failed. $OUT defaults to a new temporary folder.
# Environment: VOLT_DEVICE_PACK (device-pack), VOLT_DEVICE_BUILD (build-device, build-device-dry),
# VOLT_DEVICE_PYTHON (python3), VOLT_JOBS (all cores), VOLT_DEVICE_TARGETS (the targets to build,
# space-separated; the checks whose binary is not built are skipped, e.g. for a quick build test).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

dry_run=0
case "${1:-}" in
  --dry-run) dry_run=1 ;;
  "") ;;
  *) echo "check: unknown argument '$1'; expected nothing or --dry-run. HINT: scripts/device/check.sh on the" \
          "GPU machine, scripts/device/check.sh --dry-run here." >&2
     exit 2 ;;
esac

started=$(date +%s)
pack=$(realpath -m "${VOLT_DEVICE_PACK:-device-pack}")
if [ "$dry_run" = 1 ]; then
  build=$(realpath -m "${VOLT_DEVICE_BUILD:-build-device-dry}")
  export PYTHONPATH=${VOLT_TORCHRUN_PYTHONPATH:-/opt/volt/python-torchrun}${PYTHONPATH:+:$PYTHONPATH}
else
  build=$(realpath -m "${VOLT_DEVICE_BUILD:-build-device}")
fi
python=${VOLT_DEVICE_PYTHON:-python3}
jobs=${VOLT_JOBS:-$(nproc)}
OUT=${OUT:-$(mktemp -d -t volt-device-check.XXXXXX)}
mkdir -p "$OUT" "$build"
report=$OUT/report.md
build_log=$OUT/build.log
checks_log=$OUT/checks.log
: >"$build_log"
: >"$checks_log"
work=$build/check-work
rm -rf "$work"
mkdir -p "$work"

if [ ! -f "$pack/.complete" ]; then
  echo "check: no complete pack at $pack (expected $pack/.complete and $pack/debs/*.deb). HINT: run" \
       "scripts/device/pack.sh here first, and name device-pack in the run tool's carry." >&2
  exit 2
fi

# --- the report ------------------------------------------------------------------------------
rows=()
failed=0
# record NAME RESULT DETAIL: one row of the report's table; RESULT is pass, fail or skip.
# A check that the budget left unrun is a skip, whatever its caller says. The report is rewritten
# after every row, so a run killed at the run tool's limit still brings one back.
record() {
  local result=$2
  [[ "$3" != *"not run: "* ]] || result=skip
  rows+=("| $1 | $result | $3 |")
  [ "$result" != fail ] || failed=1
  printf '[%s] %s: %s\n' "$result" "$1" "$3" | tee -a "$checks_log"
  write_report
}
write_report() {
  {
    echo "# Volt's prepared GPU check"
    echo
    echo "- mode: $([ "$dry_run" = 1 ] && echo "dry run (no GPU; GPU checks skipped)" || echo "GPU run")"
    echo "- commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), host: ${HOSTNAME:-?}, $(nproc) cores"
    echo "- torch: ${torch_version:-?} (CUDA ${torch_cuda:-none}), GPU: ${gpu_name:-none}"
    echo "- build: ${build_seconds:-?} s (${jobs} jobs), checks: $(( $(date +%s) - checks_started )) s, total: $(( $(date +%s) - started )) s"
    echo
    echo "| check | result | figures / reason |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${rows[@]}"
  } >"$report"
}
checks_started=$(date +%s)
# Everything, build included, within VOLT_DEVICE_BUDGET seconds (8 minutes on the GPU machine; an
# hour for the dry run's build on 2 cores): a check that would start with less than 15 s left is
# not run, so the report comes back inside the run tool's limit.
budget=${VOLT_DEVICE_BUDGET:-$([ "$dry_run" = 1 ] && echo 3600 || echo 480)}
deadline=$(( started + budget ))

# --- 1. the prefix -----------------------------------------------------------------------------
prefix=$build/prefix
stamp=$(cd "$pack/debs" && printf '%s\n' *.deb | sort | md5sum | cut -d' ' -f1)
if [ "$(cat "$prefix/.unpacked" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for deb in "$pack"/debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$prefix"
    else
      # A .deb is an ar archive holding data.tar.{xz,zst,gz}.
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$prefix")
      rm -rf "$tmp"
    fi
  done
  echo "$stamp" >"$prefix/.unpacked"
  # A new prefix may hold a header that the objects built before it found in /usr/include (the dry
  # run's compiler still searches there), and ccache would hand those objects back with their old
  # header lists: build them all again, past ccache, so the header check below sees the truth.
  find "$build" -name '*.o' -delete
  export CCACHE_RECACHE=1
fi
multiarch=x86_64-linux-gnu
prefix_libs="$prefix/usr/lib/$multiarch:$prefix/lib/$multiarch"
# protoc and pkg-config run at build time, Volt's binaries at check time: their libraries are the
# prefix's. Python is never given this path (the machine's own libssl, libffi ... stay its own).
volt_env=(env "LD_LIBRARY_PATH=$prefix_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
export PKG_CONFIG_LIBDIR="$prefix/usr/lib/$multiarch/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR=$prefix
export PKG_CONFIG_PATH=""
# A pip CMake 4.x refuses package files that ask for policies older than 3.5, as some of
# bookworm's do; 3.25 (here) ignores this.
export CMAKE_POLICY_VERSION_MINIMUM=3.5

# --- 2. configure and build ------------------------------------------------------------------
torch_info=$("$python" - <<'PY' 2>>"$build_log"
import os, torch
print(torch.utils.cmake_prefix_path)
print(os.path.dirname(torch.__file__))
print(torch.__version__)
print(torch.version.cuda or "")
try:
    print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as error:  # a driver that fails to initialise: the GPU checks skip, saying why
    print("")
    print(f"torch.cuda failed: {error}", file=__import__("sys").stderr)
PY
) || {
  echo "check: '$python -c \"import torch\"' failed (see $build_log). HINT: set VOLT_DEVICE_PYTHON to the" \
       "python whose torch to build against." >&2
  exit 2
}
{ read -r torch_cmake; read -r torch_dir; read -r torch_version; read -r torch_cuda; read -r gpu_name || true; } <<<"$torch_info"
site=$(dirname "$torch_dir")

# -O2 on the GPU (the figures are timings); the dry run proves the build path, and -O0 halves its
# compile time on this machine's 2 cores, as CI's CUDA stage does.
optimise=$([ "$dry_run" = 1 ] && echo -O0 || echo -O2)
cmake_args=(
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=$optimise -DNDEBUG" -DVOLT_UNITY_BUILD=ON -DVOLT_BUILD_TESTS=ON
  -DVOLT_WERROR=OFF
  "-DCMAKE_PREFIX_PATH=$torch_cmake;$prefix/usr"
  "-DTorch_DIR=$torch_cmake/Torch"
  "-Dc10_LIBRARY=$torch_dir/lib/libc10.so"
  "-DProtobuf_PROTOC_EXECUTABLE=$prefix/usr/bin/protoc"
  "-DPKG_CONFIG_EXECUTABLE=$prefix/usr/bin/pkg-config"
)
# Libraries LibTorch's own libraries link (NVIDIA's wheels beside torch, the prefix's for libcurl's
# dependencies): searched when linking, not linked by Volt.
link_dirs=$(find -L "$site/nvidia" -mindepth 2 -maxdepth 2 -type d \( -name lib -o -name lib64 \) 2>/dev/null |
  sort | tr '\n' ';' || true)
link_dirs+="$prefix/usr/lib/$multiarch;$prefix/lib/$multiarch"
if [ -n "$torch_cuda" ]; then
  cuda_root=${CUDAToolkit_ROOT:-}
  [ -n "$cuda_root" ] || { [ -x /usr/local/cuda/bin/nvcc ] && cuda_root=/usr/local/cuda; } ||
    cuda_root=$(dirname "$(dirname "$(command -v nvcc || echo /nonexistent/bin/nvcc)")")
  if [ ! -x "$cuda_root/bin/nvcc" ]; then
    echo "check: torch $torch_version is a CUDA build but no nvcc was found (looked in \$CUDAToolkit_ROOT," \
         "/usr/local/cuda and PATH). HINT: set CUDAToolkit_ROOT to the CUDA toolkit's folder." >&2
    exit 2
  fi
  cmake_args+=("-DCUDAToolkit_ROOT=$cuda_root" "-DCMAKE_CUDA_COMPILER=$cuda_root/bin/nvcc")
  # Without a driver (the dry run), libcaffe2_nvrtc.so's libcuda.so.1 is the toolkit's stub, at link time only.
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    mkdir -p "$build/driver-stub"
    ln -sf "$cuda_root/lib64/stubs/libcuda.so" "$build/driver-stub/libcuda.so.1"
    link_dirs+=";$build/driver-stub"
  fi
fi
cmake_args+=("-DVOLT_LINK_ONLY_LIBRARY_DIRS=$link_dirs")
if [ "$dry_run" = 1 ]; then
  # Prove that the prefix is what is used: CMake may not find these packages' system copies (their
  # CMake configs under /usr/lib/<arch>/cmake and /usr/share, libraries and headers under /usr).
  # The compiler's own /usr/include stays on its search path (only a --sysroot would hide it); the
  # check below reads every compiled file's dependencies instead.
  ignore="/usr/lib/$multiarch/cmake;/usr/share/cmake;/usr/lib/cmake;/usr/include;/usr/lib/$multiarch;/lib/$multiarch"
  ignore+=";/usr/lib/$multiarch/cmake/fmt;/usr/lib/$multiarch/cmake/yaml-cpp;/usr/lib/cmake/GTest"
  ignore+=";/usr/share/cmake/nlohmann_json;/usr/share/cmake/CLI11;/usr/lib/$multiarch/cmake/CLI11"
  cmake_args+=("-DCMAKE_IGNORE_PATH=$ignore")
fi

targets=${VOLT_DEVICE_TARGETS:-trainer_cuda_test fashion_mnist bench_gpt_throughput bench_snapshot_overhead}
build_started=$(date +%s)
build_ok=1
# shellcheck disable=SC2086  # $targets: one word per target
{
  echo "== configure: cmake ${cmake_args[*]}" &&
    "${volt_env[@]}" cmake -S "$root" -B "$build" -G Ninja "${cmake_args[@]}" &&
    echo "== build: $targets (-j$jobs)" &&
    "${volt_env[@]}" cmake --build "$build" -j "$jobs" --target $targets
} >>"$build_log" 2>&1 || build_ok=0
build_seconds=$(( $(date +%s) - build_started ))
if [ "$build_ok" = 0 ]; then
  record build fail "configure or build failed after ${build_seconds} s: see build.log ($(grep -m1 -E 'error:|Error|FAILED' "$build_log" | cut -c1-200 | tr '|' '/'))"
  write_report
  echo "check: the build failed; report in $report, log in $build_log" >&2
  exit 1
fi
record build pass "${build_seconds} s for $targets, -j$jobs"

# The prefix, not the system, supplied the dependencies: CMake's cache and the compiler's
# dependency lists name no system copy of them.
system_hits=$( (grep -E '^[A-Za-z_]+(_DIR|_LIBRARY|_INCLUDE_DIR|_EXECUTABLE)[^=]*=/usr/(lib|include|share|bin)' "$build/CMakeCache.txt" |
                 grep -Ei 'fmt|yaml|json|cli11|protobuf|protoc|png|jpeg|curl|gtest|gmock|zlib|pkg' || true) | sort -u)
header_hits=$(ninja -C "$build" -t deps 2>/dev/null |
  grep -oE '^ +/usr/include/(gloo|fmt|yaml-cpp|nlohmann|CLI|google/protobuf|libpng16|png\.h|turbojpeg\.h|curl|gtest|gmock|zlib\.h)[^ ]*' |
  sort -u | head -n 5 || true)
# ... and at run time the example loads them from the prefix.
runtime_hits=$("${volt_env[@]}" ldd "$build/examples/fashion_mnist" 2>/dev/null |
  grep -E 'lib(fmt|yaml-cpp|protobuf|png16|turbojpeg|curl)\.so' | grep -v -F "$prefix" | awk '{print $3}' || true)
system_hits+=$runtime_hits
checks_started=$(date +%s)
if [ -z "$system_hits" ] && [ -z "$header_hits" ]; then
  record prefix pass "CMake's cache, every compiled file's headers and the example's libraries (ldd) are the prefix's, none of /usr's"
else
  record prefix "$([ "$dry_run" = 1 ] && echo fail || echo pass)" \
    "system copies used: $(printf '%s %s' "$system_hits" "$header_hits" | tr '\n' ' ' | cut -c1-300)"
fi

# No call of a program binds to LibTorch's own copy of libstdc++'s std::filesystem (PyPI's wheels
# export one, built for another libstdc++; the top CMakeLists.txt names libstdc++ first): the
# first GPU run died in that copy's remove_all. LD_BIND_NOW binds every symbol at start.
name="std::filesystem bound to libstdc++, not to LibTorch's copy"
probe=
for candidate in bench/bench_snapshot_overhead examples/fashion_mnist bench/bench_gpt_throughput; do
  if [ -x "$build/$candidate" ]; then probe=$build/$candidate; break; fi
done
if [ -z "$probe" ]; then
  record "$name" skip "no program of the checks built (VOLT_DEVICE_TARGETS)"
else
  bindings=$(LD_BIND_NOW=1 LD_DEBUG=bindings "${volt_env[@]}" "$probe" --help 2>&1 >/dev/null | grep '_ZNSt10filesystem' || true)
  to_torch=$(grep -cE ' to [^ ]*/lib(torch|c10)[^/ ]*\.so' <<<"$bindings" || true)
  all=$(grep -c . <<<"$bindings" || true)
  if [ "$all" -gt 0 ] && [ "$to_torch" = 0 ]; then
    record "$name" pass "$(basename "$probe"): $all std::filesystem bindings, none to LibTorch"
  else
    record "$name" fail "$(basename "$probe"): $to_torch of $all std::filesystem bindings go to LibTorch's copy ($(grep -m1 -oE ' to [^ ]*' <<<"$bindings"))"
  fi
fi

bin() { echo "$build/$1"; }
have() { [ -x "$(bin "$1")" ]; }

# run_check NAME SECONDS COMMAND...: runs COMMAND under `timeout`, its output into checks.log and
# $work/NAME.out; returns its status (124: the time limit) and leaves it in check_status too (after
# `if ! run_check ...`, $? is the negation's).
run_check() {
  local name=$1 seconds=$2 status=0 left
  shift 2
  left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 15 ]; then
    echo "== $name: not run, ${left} s of the budget left" | tee "$work/$name.out" >>"$checks_log"
    check_status=125
    return 125
  fi
  [ "$seconds" -le "$left" ] || seconds=$left
  echo "== $name (limit ${seconds} s): $*" >>"$checks_log"
  timeout --kill-after=10 "$seconds" "$@" >"$work/$name.out" 2>&1 || status=$?
  if [ "$status" -gt 128 ] && grep -q '^volt-bench: died of a signal' "$work/$name.out" && command -v c++filt >/dev/null; then
    c++filt <"$work/$name.out" >"$work/$name.demangled" && mv "$work/$name.demangled" "$work/$name.out"
  fi
  cat "$work/$name.out" >>"$checks_log"
  echo "== $name: exit $status" >>"$checks_log"
  check_status=$status
  return "$status"
}
why() {  # the reason a check failed, from its status and output
  if [ "$1" = 125 ]; then echo "not run: the $budget s budget was spent"
  elif [ "$1" = 124 ] || [ "$1" = 137 ]; then echo "timed out"; else
    echo "exit $1: $(grep -m1 -iE 'error|fail|what\(\)|died of a signal' "$work/$2.out" | cut -c1-200 | tr '|' '/')"; fi
}

gpu=0
[ -n "$gpu_name" ] && gpu=1
no_gpu="no GPU: $([ "$dry_run" = 1 ] && echo "dry run" || echo "torch.cuda.is_available() is false")"
# What the GPU checks name: the accelerator, the process group's backend, torch's device, the GPT's
# python and size. VOLT_DEVICE_FAKE_GPU=1 (dry run only) runs them on the CPU instead (gloo, a
# tiny GPT, Debian's python with Lightning 2.2), to test this script's own logic before a GPU
# window: their figures mean nothing (DeviceStatsMonitor's CUDA row fails there, as it should).
gpu_accel=gpu
pg_backend=nccl
torch_device=cuda
gpt_python=("$python")
gpt_size=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 32 --warmup-steps 10)
gpt_steps=80
gpt_warmup=20
# The snapshot check's GPT: GPT-2 small's shape (124 M parameters, 1.5 GB with AdamW's moments).
# On the H200 a step took 25-36 ms and writing a snapshot about 2.9 s: 200 steps (5-7 s) between
# them leave the writer time to finish (a snapshot due while it writes waits for it), and the
# warmup leaves out the first one, which allocates 1.5 GB of pinned buffers once (0.76 s there).
snap_size=(--n-layer 12 --n-head 12 --n-embd 768 --block-size 256 --batch-size 8)
snap_steps=610
snap_every=200
snap_warmup=205
snap_repeats=2
if [ "$dry_run" = 1 ] && [ "${VOLT_DEVICE_FAKE_GPU:-0}" = 1 ]; then
  gpu=1
  gpu_accel=cpu
  pg_backend=gloo
  torch_device=cpu
  gpt_python=(env -u PYTHONPATH "PYTHONPATH=${VOLT_LIGHTNING2_PYTHONPATH:-/opt/volt/python-lightning2}" /usr/bin/python3)
  gpt_size=(--n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --batch-size 4 --warmup-steps 2)
  gpt_steps=12
  gpt_warmup=4
  snap_size=(--n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --batch-size 4)
  snap_steps=24
  snap_every=8
  snap_warmup=9
fi

# shellcheck source=scripts/device/checks.sh
source "$root/scripts/device/checks.sh"

write_report
echo "check: report in $report (build.log and checks.log beside it), $(( $(date +%s) - started )) s"
exit "$failed"
