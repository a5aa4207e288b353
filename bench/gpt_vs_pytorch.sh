#!/usr/bin/env bash
# The example's GPT trained by Volt (bench_gpt_throughput), by a plain PyTorch loop and by
# PyTorch Lightning 1.9.5 (bench/pytorch_gpt.py, Debian's torch 1.13: the same LibTorch), from the
# same initial weights on the same batches with the same AdamW and schedule, 1 thread per
# process, under the same allocator settings, at 1 and 2 processes, at two sizes:
#   small    2 layers x 64 wide, context 64, batch 8: a step of a few ms, where a framework's
#            per-step cost shows
#   default  the example's default, 4 layers x 128 wide, context 128, batch 16
# plus Volt with --activation-checkpointing on the default size. Contenders run in turn, REPEATS
# times over (default 3); figures are each contender's median (and range), ratios from medians
# of the same run. The losses of every contender are compared step by step with Volt's.
#   bench/gpt_vs_pytorch.sh [build dir]          the benchmark (~10 min on 2 cores)
#   bench/gpt_vs_pytorch.sh --check [build dir]  8 steps of a tiny GPT, Volt against PyTorch at 1
#                                                process: prints "losses agree" or fails (CTest)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
check=0
if [ "${1:-}" = --check ]; then
  check=1
  shift
fi
build=${1:-$root/build}
repeats=${REPEATS:-3}
lightning_path=${VOLT_LIGHTNING_PYTHONPATH:-/opt/volt/python-lightning}
# Volt pins these thresholds itself (tune_allocator); give Python's processes the same.
export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824
export OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# 256 KB of English: the licenses every Debian system has, in a fixed order.
find /usr/share/common-licenses -maxdepth 1 -type f | sort | xargs cat >"$work/text.txt"

# run NAME SIZE-FLAGS STEPS WARMUP PROCESSES: one contender's run; appends its line to $work/NAME.
run() {
  local name=$1 size=$2 steps=$3 warmup=$4 processes=$5 out
  # The learning rate's warmup: a tenth of the run, on every side.
  size="$size --warmup-steps $(( steps / 10 > 0 ? steps / 10 : 1 ))"
  case $name in
    */volt*)
      local extra=()
      [[ $name == *ckpt* ]] && extra+=(--activation-checkpointing)
      [ "$processes" -gt 1 ] && extra+=(--strategy ddp)
      # shellcheck disable=SC2086
      out=$("$build/bench/bench_gpt_throughput" $size --text "$work/text.txt" --max-steps "$steps" --warmup "$warmup" \
        --devices "$processes" --init-out "$work/init.safetensors" "${extra[@]}") ;;
    */pytorch*)
      # shellcheck disable=SC2086
      out=$(/usr/bin/python3 "$root/bench/pytorch_gpt.py" --framework pytorch $size --text "$work/text.txt" \
        --steps "$steps" --warmup "$warmup" --processes "$processes" --init "$work/init.safetensors") ;;
    */lightning*)
      # shellcheck disable=SC2086
      out=$(cd "$work" && PYTHONPATH="$lightning_path" /usr/bin/python3 "$root/bench/pytorch_gpt.py" \
        --framework lightning $size --text "$work/text.txt" --steps "$steps" --warmup "$warmup" \
        --processes "$processes" --init "$work/init.safetensors" 2>"$work/lightning.err") ||
        { cat "$work/lightning.err" >&2; return 1; } ;;
  esac
  grep -E '^(volt|pytorch|lightning) processes=' <<<"$out" | sed "s|^|$name |" >>"$work/lines"
  grep '^losses' <<<"$out" | sed "s|^|$name |" >>"$work/losses"
  grep -E '^(volt|pytorch|lightning) processes=' <<<"$out" | sed "s|^|  $name: |"
}

summarise() {
  python3 - "$work/lines" "$work/losses" "$check" <<'PY'
import collections
import statistics
import sys

lines, losses_file, check = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
figures = collections.defaultdict(list)
for line in open(lines):
    name, _, *fields = line.split()
    figures[name].append({k: float(v) for k, v in (f.split("=") for f in fields)})
losses = {}
for line in open(losses_file):
    name, _, *values = line.split()
    losses[name] = [float(v) for v in values]  # every repeat gives the same losses; keep the last

worst = 0.0
for name in sorted(losses):
    size, contender = name.split("/")
    processes = "".join(c for c in contender if c.isdigit())
    reference = losses.get(f"{size}/volt{processes}")
    if reference is None or name == f"{size}/volt{processes}":
        continue
    diff = max(abs(a - b) for a, b in zip(losses[name], reference))
    worst = max(worst, diff)
    print(f"loss difference {name} vs volt, {len(reference)} steps: max {diff:.2e} "
          f"(first loss {losses[name][0]:.6f} vs {reference[0]:.6f}, last {losses[name][-1]:.4f} vs {reference[-1]:.4f})")
if check:
    # fp32 on the same batches: rounding differences only, growing a little with the steps.
    if worst > 1e-3 or not losses:
        sys.exit(f"losses differ by {worst:.3g}: the contenders do not train the same model")
    print(f"losses agree (max difference {worst:.2e} over {len(next(iter(losses.values())))} steps)")
    sys.exit(0)

median = {n: statistics.median(r["tokens_per_s"] for r in runs) for n, runs in figures.items()}
for name in sorted(figures):
    runs = figures[name]
    t = [r["tokens_per_s"] for r in runs]
    step = statistics.median(r["step_ms"] for r in runs)
    flops = statistics.median(r["flops_per_s"] for r in runs)
    print(f"{name:22} tokens/s median {median[name]:9.0f} (runs {min(t):.0f} to {max(t):.0f}), "
          f"step {step:8.2f} ms, model {flops / 1e9:6.2f} GFLOP/s")
for size in sorted({n.split('/')[0] for n in figures}):
    for p in ("1", "2"):
        v = median.get(f"{size}/volt{p}")
        for other in ("pytorch", "lightning"):
            o = median.get(f"{size}/{other}{p}")
            if v and o:
                print(f"{size}, {p} process(es): volt/{other} tokens/s = {v / o:.3f}x")
    v, c = median.get(f"{size}/volt1"), median.get(f"{size}/volt1-ckpt")
    if v and c:
        print(f"{size}: step time with activation checkpointing / without = {v / c:.3f}x")
PY
}

tiny="--n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --batch-size 4"
small="--n-layer 2 --n-head 2 --n-embd 64 --block-size 64 --batch-size 8"
default="--n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --batch-size 16"
: >"$work/lines"
: >"$work/losses"
if [ "$check" = 1 ]; then
  run tiny/volt1 "$tiny" 8 2 1
  run tiny/pytorch1 "$tiny" 8 2 1
  summarise
  exit
fi
for r in $(seq "$repeats"); do
  echo "repeat $r of $repeats"
  for p in 1 2; do
    for side in volt pytorch lightning; do run "small/$side$p" "$small" 300 30 "$p"; done
  done
  for p in 1 2; do
    for side in volt pytorch lightning; do run "default/$side$p" "$default" 40 5 "$p"; done
  done
  run default/volt1-ckpt "$default" 40 5 1
done
summarise
