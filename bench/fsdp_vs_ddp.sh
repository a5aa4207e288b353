#!/usr/bin/env bash
# strategy='fsdp' (shard_grad_op, and full_shard with each Linear a volt::FsdpUnit) against Volt's ddp and PyTorch's own sharding on CPU
# (ZeroRedundancyOptimizer over DistributedDataParallel on Debian's torch 1.13, whose FSDP needs
# CUDA; and FullyShardedDataParallel SHARD_GRAD_OP and FULL_SHARD (each Linear a unit) on torch 2.x from PyPI, which runs on CPU over
# Gloo, when scripts/setup.sh installed it: VOLT_TORCHRUN_PYTHONPATH) on the benchmark MLP (bench/ddp_throughput.cpp, bench/pytorch_ddp.py: 784-256-256-10,
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
torch2=${VOLT_TORCHRUN_PYTHONPATH:-/opt/volt/python-torchrun}
sides=(ddp fsdp full zero)
if [ -d "$torch2/torch" ]; then sides+=(ptfsdp ptfull); else echo "no torch 2.x in $torch2: PyTorch FSDP left out" >&2; fi
for p in "${counts[@]}"; do
  declare -A ms=() state=() grads=() params=()
  for side in ptfsdp ptfull; do ms[$side]=0 state[$side]=0; done
  for side in "${sides[@]}"; do
    case $side in
      zero) out=$(/usr/bin/python3 "$root/bench/pytorch_ddp.py" --zero --processes "$p" --steps "$steps" --warmup 50) ;;
      ptfsdp | ptfull)
        mode=shard_grad_op
        [ "$side" = ptfull ] && mode=full_shard
        out=$(PYTHONPATH="$torch2" /usr/bin/python3 "$root/bench/pytorch_ddp.py" --fsdp "$mode" --processes "$p" \
              --steps "$steps" --warmup 50) ;;
      # --tune-allocator: full_shard leaves the thresholds alone unless asked; every side runs with them pinned.
      full) out=$("$build/bench/bench_ddp_throughput" --strategy fsdp --sharding-strategy full_shard --devices "$p" \
                  --tune-allocator --max-steps "$steps" --warmup 50) ;;
      *) out=$("$build/bench/bench_ddp_throughput" --strategy "$side" --devices "$p" --max-steps "$steps" --warmup 50) ;;
    esac
    grep '^memory' <<<"$out" | sort | sed "s/^/$side /"
    ms[$side]=$(sed -nE 's/^(volt|pytorch-zero|pytorch-fsdp) .*step_ms=([0-9.]+).*/\2/p' <<<"$out")
    # The largest rank's share: what a per-process memory limit must hold.
    state[$side]=$(sed -nE 's/^memory .*optimizer_state=([0-9]+).*/\1/p' <<<"$out" | sort -n | tail -1)
    grads[$side]=$(sed -nE 's/^memory .*gradients=([0-9]+).*/\1/p' <<<"$out" | sort -n | tail -1)
    params[$side]=$(sed -nE 's/^memory .*parameters=([0-9]+).*/\1/p' <<<"$out" | sort -n | tail -1)
  done
  python3 - "$p" "${ms[ddp]}" "${ms[fsdp]}" "${ms[zero]}" "${state[ddp]}" "${state[fsdp]}" "${state[zero]}" \
    "${grads[ddp]}" "${grads[fsdp]}" "${ms[ptfsdp]}" "${state[ptfsdp]}" "${ms[full]}" "${state[full]}" \
    "${grads[full]}" "${params[ddp]}" "${params[full]}" "${ms[ptfull]}" "${state[ptfull]}" <<'PY'
import sys
p = int(sys.argv[1])
(ms_ddp, ms_fsdp, ms_zero, st_ddp, st_fsdp, st_zero, gr_ddp, gr_fsdp, ms_pt, st_pt, ms_full, st_full, gr_full,
 pa_ddp, pa_full, ms_ptfull, st_ptfull) = map(float, sys.argv[2:])
print(f"{p} processes: step_ms volt ddp {ms_ddp:.3f}, volt fsdp {ms_fsdp:.3f}, volt fsdp full_shard {ms_full:.3f}, "
      f"pytorch ddp+ZeRO {ms_zero:.3f}")
print(f"{p} processes: throughput volt fsdp / volt ddp {ms_ddp / ms_fsdp:.3f}x; volt full_shard / volt ddp "
      f"{ms_ddp / ms_full:.3f}x; volt fsdp / pytorch ZeRO {ms_zero / ms_fsdp:.3f}x")
print(f"{p} processes: optimizer state per rank, volt fsdp/ddp {st_fsdp / st_ddp:.3f} (1/N = {1 / p:.3f}), "
      f"pytorch ZeRO/volt ddp {st_zero / st_ddp:.3f}; gradients held between steps volt fsdp/ddp "
      f"{gr_fsdp / gr_ddp:.3f}")
print(f"{p} processes: full_shard per rank / ddp: parameters {pa_full / pa_ddp:.3f}, gradients {gr_full / gr_ddp:.3f}, "
      f"optimizer state {st_full / st_ddp:.3f} (1/N = {1 / p:.3f})")
if ms_pt > 0:
    print(f"{p} processes: PyTorch 2.x FSDP (shard_grad_op, CPU, Gloo) step_ms {ms_pt:.3f}; throughput volt fsdp / "
          f"pytorch FSDP {ms_pt / ms_fsdp:.3f}x; optimizer state per rank pytorch FSDP/volt ddp {st_pt / st_ddp:.3f}")
if ms_ptfull > 0:
    print(f"{p} processes: PyTorch 2.x FSDP (full_shard, each Linear a unit) step_ms {ms_ptfull:.3f}; throughput "
          f"volt full_shard / pytorch FSDP full_shard {ms_ptfull / ms_full:.3f}x; optimizer state per rank pytorch "
          f"FSDP full_shard/volt ddp {st_ptfull / st_ddp:.3f}")
PY
done
