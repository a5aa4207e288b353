#!/usr/bin/env bash
# strategy='fsdp' (shard_grad_op) against Volt's ddp and PyTorch's own sharding on CPU
# (ZeroRedundancyOptimizer over DistributedDataParallel, Python, Gloo: torch 1.13's FSDP needs
# CUDA) on the benchmark MLP (bench/ddp_throughput.cpp, bench/pytorch_ddp.py: 784-256-256-10,
# Adam, batch 64 per process, 1 thread per process, the same malloc thresholds), measured in one
# run: each rank's bytes of optimizer state (and Volt's parameters and gradients) between steps,
# and the time per step, as ratios at each process count.
#   bench/fsdp_vs_ddp.sh [steps] [process counts...]      e.g. bench/fsdp_vs_ddp.sh 300 2 4
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-300}
shift || true
counts=("${@:-2}")
build=${VOLT_BUILD_DIR:-$root/build}
export OMP_NUM_THREADS=1
# Volt pins these thresholds itself (tune_allocator); give Python's processes the same.
export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824
for p in "${counts[@]}"; do
  declare -A ms=() state=() grads=()
  for side in ddp fsdp zero; do
    if [ "$side" = zero ]; then
      out=$(/usr/bin/python3 "$root/bench/pytorch_ddp.py" --zero --processes "$p" --steps "$steps" --warmup 50)
    else
      out=$("$build/bench/bench_ddp_throughput" --strategy "$side" --devices "$p" --max-steps "$steps" --warmup 50)
    fi
    grep '^memory' <<<"$out" | sort | sed "s/^/$side /"
    ms[$side]=$(sed -nE 's/^(volt|pytorch-zero) .*step_ms=([0-9.]+).*/\2/p' <<<"$out")
    # The largest rank's share: what a per-process memory limit must hold.
    state[$side]=$(sed -nE 's/^memory .*optimizer_state=([0-9]+).*/\1/p' <<<"$out" | sort -n | tail -1)
    grads[$side]=$(sed -nE 's/^memory .*gradients=([0-9]+).*/\1/p' <<<"$out" | sort -n | tail -1)
  done
  python3 - "$p" "${ms[ddp]}" "${ms[fsdp]}" "${ms[zero]}" "${state[ddp]}" "${state[fsdp]}" "${state[zero]}" \
    "${grads[ddp]}" "${grads[fsdp]}" <<'PY'
import sys
p = int(sys.argv[1])
ms_ddp, ms_fsdp, ms_zero, st_ddp, st_fsdp, st_zero, gr_ddp, gr_fsdp = map(float, sys.argv[2:])
print(f"{p} processes: step_ms volt ddp {ms_ddp:.3f}, volt fsdp {ms_fsdp:.3f}, pytorch ddp+ZeRO {ms_zero:.3f}")
print(f"{p} processes: throughput volt fsdp / volt ddp {ms_ddp / ms_fsdp:.3f}x; volt fsdp / pytorch ZeRO "
      f"{ms_zero / ms_fsdp:.3f}x")
print(f"{p} processes: optimizer state per rank, volt fsdp/ddp {st_fsdp / st_ddp:.3f} (1/N = {1 / p:.3f}), "
      f"pytorch ZeRO/volt ddp {st_zero / st_ddp:.3f}; gradients held between steps volt fsdp/ddp "
      f"{gr_fsdp / gr_ddp:.3f}")
PY
done
