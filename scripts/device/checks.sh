# shellcheck shell=bash disable=SC2154  # check.sh's variables: pack, work, volt_env, gpu, ...
# The checks of scripts/device/check.sh, sourced by it after the build (not run on its own): each
# runs under its own time limit and records one row of the report (record NAME RESULT FIGURES).
# Uses check.sh's bin, have, run_check, why, record, gpu, no_gpu, pack, work, volt_env, python.
# Time limits (seconds) add up to under 8 minutes with the build of a warm machine's 16 cores.

data_dir=$pack/data/fashion-mnist
text=$pack/data/text.txt

# metric CSV COLUMN: the last value logged in that column of a metrics.csv ("" when none).
metric() {
  /usr/bin/env python3 - "$1" "$2" <<'PY'
import csv, sys
value = ""
with open(sys.argv[1]) as f:
    for row in csv.DictReader(f):
        if row.get(sys.argv[2]):
            value = row[sys.argv[2]]
print(value)
PY
}
# fm NAME SECONDS FLAGS...: the Fashion-MNIST example into $work/NAME (its own root dir).
fm() {
  local name=$1 seconds=$2
  shift 2
  run_check "$name" "$seconds" "${volt_env[@]}" "$(bin examples/fashion_mnist)" --data-dir "$data_dir" \
    --default-root-dir "$work/$name" --enable-progress-bar=false --num-threads 4 "$@"
}
csv_of() { find "$work/$1" -name metrics.csv | sort | tail -n 1; }
ckpt_of() { find "$work/$1" -name last.ckpt | sort | tail -n 1; }
fmt3() { [ -n "$1" ] && printf '%.4f' "$1" || echo "?"; }

# --- the example on the CPU: the binary loads the prefix's libraries and trains (always) ---------
if have examples/fashion_mnist; then
  if fm cpu_smoke 120 --accelerator cpu --max-epochs 1 --limit-train-batches 40 --limit-val-batches 5 --no-test; then
    record "example on the CPU (40 steps)" pass "val/acc $(fmt3 "$(metric "$(csv_of cpu_smoke)" val/acc)")"
  else
    record "example on the CPU (40 steps)" fail "$(why "$check_status" cpu_smoke)"
  fi
else
  record "example on the CPU (40 steps)" skip "examples/fashion_mnist not built (VOLT_DEVICE_TARGETS)"
fi

# --- the *_CUDA unit tests ---------------------------------------------------------------------
if have src/volt/trainer/trainer_cuda_test; then
  status=0
  run_check cuda_tests 120 "${volt_env[@]}" "$(bin src/volt/trainer/trainer_cuda_test)" --gtest_filter='*_CUDA' ||
    status=$?
  out=$work/cuda_tests.out
  # One line per test ends in its time, "(12 ms)"; gtest's summary repeats the names without it.
  passed=$(grep -cE '^\[ +OK \] .* \([0-9]+ ms\)$' "$out" || true)
  skipped=$(grep -cE '^\[ +SKIPPED \] .* \([0-9]+ ms\)$' "$out" || true)
  failing=$(grep -E '^\[ +FAILED +\] .* \([0-9]+ ms\)$' "$out" | sed 's/.*\] //; s/ (.*//' | tr '\n' ' ' || true)
  skips=$(grep -E '^needs [0-9]+ CUDA device' "$out" | sort | uniq -c | awk '{$1 = $1 "x"; print}' | tr '\n' ';' || true)
  figures="$passed passed, $skipped skipped${skips:+ ($skips)}"
  if [ "$status" != 0 ]; then
    record "*_CUDA tests (trainer_cuda_test)" fail "$figures; failed: ${failing:-$(why "$status" cuda_tests)}"
  elif [ "$passed" = 0 ]; then
    record "*_CUDA tests (trainer_cuda_test)" skip "$figures"
  else
    record "*_CUDA tests (trainer_cuda_test)" pass "$figures"
  fi
else
  record "*_CUDA tests (trainer_cuda_test)" skip "trainer_cuda_test not built (VOLT_DEVICE_TARGETS)"
fi

# --- the example on the GPU in three precisions: accuracy and step time --------------------------
epoch=()  # a whole epoch on the GPU; 40 batches where VOLT_DEVICE_FAKE_GPU puts it on the CPU
[ "$gpu_accel" = gpu ] || epoch=(--limit-train-batches 40 --limit-val-batches 5)
for precision in 32-true bf16-mixed 16-mixed; do
  name="example on the GPU, $precision, 1 epoch"
  if [ "$gpu" = 0 ]; then record "$name" skip "$no_gpu"; continue; fi
  if ! have examples/fashion_mnist; then record "$name" skip "examples/fashion_mnist not built"; continue; fi
  if fm "gpu_$precision" 90 --accelerator "$gpu_accel" --devices 1 --precision "$precision" --max-epochs 1 --no-test \
       --throughput-monitor --log-every-n-steps 20 ${epoch[@]+"${epoch[@]}"}; then
    csv=$(csv_of "gpu_$precision")
    bps=$(metric "$csv" train/batches_per_sec)
    step_ms=$([ -n "$bps" ] && awk -v b="$bps" 'BEGIN {printf "%.2f", 1000 / b}' || echo "?")
    record "$name" pass "val/acc $(fmt3 "$(metric "$csv" val/acc)"), step ${step_ms} ms (ThroughputMonitor)"
  else
    record "$name" fail "$(why "$check_status" "gpu_$precision")"
  fi
done

# --- a checkpoint written on one device resumed on the other -----------------------------------
# resume FROM TO: one epoch of 50 steps on FROM, then its last.ckpt resumed on TO for a second epoch.
resume() {
  local from=$1 to=$2 name="checkpoint written on the $1, resumed on the $2"
  local steps=(--limit-train-batches 50 --limit-val-batches 5 --no-test)
  if [ "$gpu" = 0 ]; then record "$name" skip "$no_gpu"; return; fi
  if ! have examples/fashion_mnist; then record "$name" skip "examples/fashion_mnist not built"; return; fi
  local from_accel=${from/gpu/$gpu_accel} to_accel=${to/gpu/$gpu_accel}
  if ! fm "ckpt_$from" 90 --accelerator "$from_accel" --devices 1 --max-epochs 1 "${steps[@]}"; then
    record "$name" fail "the first epoch on the $from: $(why "$check_status" "ckpt_$from")"
    return
  fi
  if ! fm "ckpt_${from}_$to" 90 --accelerator "$to_accel" --devices 1 --max-epochs 2 "${steps[@]}" \
       --ckpt-path "$(ckpt_of "ckpt_$from")"; then
    record "$name" fail "resuming on the $to: $(why "$check_status" "ckpt_${from}_$to")"
    return
  fi
  local step
  step=$(grep -m1 -E '^ +global step' "$work/ckpt_${from}_$to.out" | awk '{print $NF}')
  if [ "$step" = 100 ]; then
    record "$name" pass "resumed at step 50, ended at step 100, val/acc $(fmt3 "$(metric "$(csv_of "ckpt_${from}_$to")" val/acc)")"
  else
    record "$name" fail "ended at global step '${step}', expected 100 (50 before the checkpoint, 50 after)"
  fi
}
resume gpu cpu
resume cpu gpu

# --- ddp and fsdp with one process over NCCL ---------------------------------------------------
# fsdp also writes its checkpoints sharded, in the background (issue #32): ModelCheckpoint's and a
# snapshot every 25 steps, each shard copied from the GPU into pinned memory; the last check
# resumes from its sharded last.ckpt on the GPU.
sharded=(--state-dict-type sharded)
for strategy in ddp fsdp; do
  name="$strategy, 1 process, NCCL"
  extra=()
  if [ "$strategy" = fsdp ]; then
    name+=", sharded checkpoints and snapshots written in the background"
    extra=("${sharded[@]}" --async-checkpointing --snapshot-every-n-steps 25)
  fi
  if [ "$gpu" = 0 ]; then record "$name" skip "$no_gpu"; continue; fi
  if ! have examples/fashion_mnist; then record "$name" skip "examples/fashion_mnist not built"; continue; fi
  if ! fm "$strategy" 90 --accelerator "$gpu_accel" --devices 1 --strategy "$strategy" --process-group-backend "$pg_backend" \
       --max-epochs 1 --limit-train-batches 100 --limit-val-batches 10 --no-test ${extra[@]+"${extra[@]}"}; then
    record "$name" fail "$(why "$check_status" "$strategy")"
    continue
  fi
  figures="val/acc $(fmt3 "$(metric "$(csv_of "$strategy")" val/acc)") after 100 steps"
  if [ "$strategy" = fsdp ]; then
    last=$(ckpt_of fsdp)
    shards=$(find "$(dirname "${last:-/nonexistent}")" -maxdepth 1 -name 'last.ckpt.*.shard0' 2>/dev/null | wc -l)
    snapshots=$(find "$work/fsdp" -maxdepth 1 -name 'snapshot_*.ckpt' | wc -l)
    if [ -z "$last" ] || [ "$shards" != 1 ] || [ "$snapshots" = 0 ]; then
      record "$name" fail "trained, but found last.ckpt '${last}' with $shards shard(s) and $snapshots snapshot(s); expected 1 and at least 1"
      continue
    fi
    figures+="; last.ckpt with its shard, $snapshots snapshots kept"
  fi
  record "$name" pass "$figures"
done
# --- pin_memory with workers, and DeviceStatsMonitor's CUDA figures ------------------------------
name="pin_memory with 4 workers, DeviceStatsMonitor"
if [ "$gpu" = 0 ]; then
  record "$name" skip "$no_gpu"
elif ! have examples/fashion_mnist; then
  record "$name" skip "examples/fashion_mnist not built"
elif fm stats 90 --accelerator "$gpu_accel" --devices 1 --num-workers 4 --pin-memory --device-stats-monitor \
     --log-every-n-steps 10 --max-epochs 1 --limit-train-batches 100 --limit-val-batches 5 --no-test; then
  csv=$(csv_of stats)
  peak=$(metric "$csv" device_stats/cuda/peak_allocated_mb)
  if [ -n "$peak" ]; then
    record "$name" pass "100 steps; CUDA peak allocated $(fmt3 "$peak") MiB, reserved $(fmt3 "$(metric "$csv" device_stats/cuda/reserved_mb)") MiB"
  else
    record "$name" fail "trained, but metrics.csv has no device_stats/cuda/peak_allocated_mb"
  fi
else
  record "$name" fail "$(why "$check_status" stats)"
fi

# --- the GPT in bf16: Volt against a plain PyTorch loop and Lightning, same model and batches ----
# bench/gpt_throughput.cpp writes the initial weights that bench/pytorch_gpt.py loads; all three
# train the same GPT on the same byte windows with the same AdamW and schedule.
name="GPT ${gpt_size[*]:0:8}, bf16-mixed: tokens/s"
if [ "$gpu" = 0 ]; then
  record "$name" skip "$no_gpu"
elif ! have bench/bench_gpt_throughput; then
  record "$name" skip "bench_gpt_throughput not built (VOLT_DEVICE_TARGETS)"
elif ! run_check gpt_volt 120 "${volt_env[@]}" "$(bin bench/bench_gpt_throughput)" "${gpt_size[@]}" --text "$text" \
       --max-steps "$gpt_steps" --warmup "$gpt_warmup" --accelerator "$gpu_accel" --devices 1 --precision bf16-mixed \
       --num-threads 4 --init-out "$work/gpt_init.safetensors"; then
  record "$name" fail "volt: $(why "$check_status" gpt_volt)"
else
  tps() { grep -m1 -E "^$1 processes=" "$work/$2.out" | grep -oE 'tokens_per_s=[0-9.e+]+' | cut -d= -f2; }
  last_loss() { grep -m1 '^losses' "$work/$1.out" | awk '{print $NF}'; }
  volt=$(tps volt gpt_volt)
  figures="volt $(printf '%.0f' "$volt") (loss $(last_loss gpt_volt))"
  result=pass
  for side in pytorch lightning; do
    if run_check "gpt_$side" 120 "${gpt_python[@]}" "$root/bench/pytorch_gpt.py" --framework "$side" "${gpt_size[@]}" \
         --text "$text" --steps "$gpt_steps" --warmup "$gpt_warmup" --init "$work/gpt_init.safetensors" \
         --device "$torch_device" --precision bf16-mixed; then
      other=$(tps "$side" "gpt_$side")
      figures+=", $side $(printf '%.0f' "$other") (loss $(last_loss "gpt_$side")), volt/$side $(awk -v a="$volt" -v b="$other" 'BEGIN {printf "%.2f", a / b}')x"
    else
      figures+=", $side failed: $(why "$check_status" "gpt_$side")"
      result=fail
    fi
  done
  record "$name" "$result" "$figures"
fi

# --- snapshots on the GPU: what they cost the step (issue #32's target: within 2% of none) -------
# bench/snapshot_overhead.cpp trains the GPT with no checkpoint, with a snapshot every
# $snap_every steps, and with a synchronous save as often, interleaved and repeated $snap_repeats times.
name="snapshots every $snap_every steps, GPT ${snap_size[*]:0:6}, bf16-mixed: step time against none"
echo "== the snapshots' memory tier, /dev/shm: $(df -h /dev/shm 2>&1 | tail -n 1)" >>"$checks_log"
if [ "$gpu" = 0 ]; then
  record "$name" skip "$no_gpu"
elif ! have bench/bench_snapshot_overhead; then
  record "$name" skip "bench_snapshot_overhead not built (VOLT_DEVICE_TARGETS)"
elif ! run_check snapshots 240 "${volt_env[@]}" "$(bin bench/bench_snapshot_overhead)" "${snap_size[@]}" \
       --text "$text" --steps "$snap_steps" --every "$snap_every" --warmup "$snap_warmup" --repeats "$snap_repeats" \
       --accelerator "$gpu_accel" --devices 1 --precision bf16-mixed --num-threads 4 --dir "$work/snapshots"; then
  record "$name" fail "$(why "$check_status" snapshots)"
else
  out=$work/snapshots.out
  against() { grep -m1 "^$1 " "$out" | grep -oE '[-+][0-9.]+% against none' | cut -d% -f1; }
  async=$(against async)
  figures="none $(grep -m1 '^none ' "$out" | grep -oE 'median [0-9.]+ ms/step'), snapshots ${async}%, synchronous saves $(against sync)%; $(grep -m1 '^stall per snapshot' "$out")"
  record "$name" "$(awk -v a="${async:-999}" 'BEGIN { print (a <= 2.0) ? "pass" : "fail" }')" "$figures"
fi

# --- fsdp's sharded last.ckpt (the fsdp row's) resumed on the GPU --------------------------------
# Last: the budget left after the snapshot row, which issue #32 needs more, pays for it.
name="fsdp's sharded last.ckpt resumed on the GPU"
last=$(ckpt_of fsdp 2>/dev/null || true)
if [ "$gpu" = 0 ]; then
  record "$name" skip "$no_gpu"
elif [ -z "$last" ]; then
  record "$name" skip "the fsdp row left no last.ckpt"
elif ! fm fsdp_resume 90 --accelerator "$gpu_accel" --devices 1 --strategy fsdp --process-group-backend "$pg_backend" \
     "${sharded[@]}" --max-epochs 2 --limit-train-batches 100 --limit-val-batches 10 --no-test --ckpt-path "$last"; then
  record "$name" fail "$(why "$check_status" fsdp_resume)"
else
  step=$(grep -m1 -E '^ +global step' "$work/fsdp_resume.out" | awk '{print $NF}')
  if [ "$step" = 200 ]; then
    record "$name" pass "resumed at step 100, ended at step 200, val/acc $(fmt3 "$(metric "$(csv_of fsdp_resume)" val/acc)")"
  else
    record "$name" fail "ended at global step '${step}', expected 200 (100 before the checkpoint, 100 after)"
  fi
fi
