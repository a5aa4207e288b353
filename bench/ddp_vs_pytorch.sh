#!/usr/bin/env bash
# Volt's ddp against PyTorch's own DistributedDataParallel (Python, Gloo) on the same MLP, data,
# optimizer and per-process batch, 1 thread per process, under the same allocator settings,
# measured in one run. Prints the throughput ratio and each side's scaling from 1 to 2 processes.
#   bench/ddp_vs_pytorch.sh [steps] [build dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-600}
build=${2:-$root/build}
# Volt pins these thresholds itself (tune_allocator); give Python's processes the same.
export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824
export OMP_NUM_THREADS=1
declare -A ms
for p in 1 2; do
  for side in volt pytorch; do
    if [ "$side" = volt ]; then
      line=$("$build/bench/bench_ddp_throughput" --devices "$p" --max-steps "$steps" --warmup 50 | grep '^volt')
    else
      line=$(/usr/bin/python3 "$root/bench/pytorch_ddp.py" --processes "$p" --steps "$steps" --warmup 50 | grep '^pytorch')
    fi
    echo "$line"
    ms[$side$p]=$(sed -E 's/.*step_ms=([0-9.]+).*/\1/' <<<"$line")
  done
done
python3 - "${ms[volt1]}" "${ms[pytorch1]}" "${ms[volt2]}" "${ms[pytorch2]}" <<'PY'
import sys
v1, p1, v2, p2 = map(float, sys.argv[1:])
print(f"throughput ratio volt/pytorch, 1 process:  {p1 / v1:.3f}x")
print(f"throughput ratio volt/pytorch, 2 processes: {p2 / v2:.3f}x")
print(f"scaling efficiency 2 vs 1 process (2 x batch per step time): volt {v1 / v2:.3f}, pytorch {p1 / p2:.3f}")
PY
