#!/usr/bin/env bash
# strategy='fsdp' (shard_grad_op) against ddp on the benchmark MLP (bench/ddp_throughput.cpp:
# 784-256-256-10, Adam, batch 64 per process, 1 thread per process), measured in one run: each
# rank's bytes of parameters, gradients and optimizer state between steps, and the time per step,
# as ratios fsdp/ddp at each process count.
#   bench/fsdp_vs_ddp.sh [steps] [process counts...]      e.g. bench/fsdp_vs_ddp.sh 300 2 4
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-300}
shift || true
counts=("${@:-2}")
build=${VOLT_BUILD_DIR:-$root/build}
export OMP_NUM_THREADS=1
for p in "${counts[@]}"; do
  declare -A ms=() state=() grads=()
  for strategy in ddp fsdp; do
    out=$("$build/bench/bench_ddp_throughput" --strategy "$strategy" --devices "$p" --max-steps "$steps" --warmup 50)
    grep '^memory' <<<"$out" | sort | sed "s/^/$strategy /"
    ms[$strategy]=$(sed -nE 's/^volt .*step_ms=([0-9.]+).*/\1/p' <<<"$out")
    # The largest rank's share: what a per-process memory limit must hold.
    state[$strategy]=$(sed -nE 's/^memory .*optimizer_state=([0-9]+).*/\1/p' <<<"$out" | sort -n | tail -1)
    grads[$strategy]=$(sed -nE 's/^memory .*gradients=([0-9]+).*/\1/p' <<<"$out" | sort -n | tail -1)
  done
  python3 - "$p" "${ms[ddp]}" "${ms[fsdp]}" "${state[ddp]}" "${state[fsdp]}" "${grads[ddp]}" "${grads[fsdp]}" <<'PY'
import sys
p = int(sys.argv[1])
ms_ddp, ms_fsdp, st_ddp, st_fsdp, gr_ddp, gr_fsdp = map(float, sys.argv[2:])
print(f"{p} processes: step_ms ddp {ms_ddp:.3f} fsdp {ms_fsdp:.3f} -> fsdp throughput {ms_ddp / ms_fsdp:.3f}x ddp's")
print(f"{p} processes: optimizer state per rank fsdp/ddp {st_fsdp / st_ddp:.3f} (1/N = {1 / p:.3f}); "
      f"gradients held between steps fsdp/ddp {gr_fsdp / gr_ddp:.3f}")
PY
done
