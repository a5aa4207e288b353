#!/usr/bin/env bash
# Builds one libFuzzer target with clang (libFuzzer + ASan + UBSan; torch-free, seconds) and fuzzes
# it for SECONDS (default 20) from its checked-in corpus, fuzz/corpus/TARGET. Exits non-zero on any
# finding.
#   fuzz/run_fuzz.sh hostlist [SECONDS]      the SLURM hostlist parser (fuzz/hostlist_fuzz.cpp)
#   fuzz/run_fuzz.sh safetensors [SECONDS]   the safetensors header parser (fuzz/safetensors_fuzz.cpp)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:?usage: fuzz/run_fuzz.sh hostlist|safetensors [SECONDS]}
seconds=${2:-20}
options=()
case "$target" in
  hostlist)
    sources=(src/volt/slurm/hostlist.cpp src/volt/core/error.cpp src/volt/core/strings.cpp)
    options=(-max_len=256) ;;
  safetensors)
    # A file's first bytes and its JSON header; the dictionary holds the format's words.
    sources=(src/volt/checkpoint/safetensors_header.cpp src/volt/core/error.cpp)
    options=(-max_len=4096 "-dict=$root/fuzz/safetensors.dict") ;;
  *)
    echo "run_fuzz.sh: unknown target '$target'; expected hostlist or safetensors" >&2
    exit 2 ;;
esac
out=${VOLT_FUZZ_DIR:-$root/build/fuzz}
corpus="$out/corpus_$target"
mkdir -p "$corpus"
cp -n "$root/fuzz/corpus/$target"/* "$corpus/" 2>/dev/null || true
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$root/src" "$root/fuzz/${target}_fuzz.cpp" "${sources[@]/#/$root/}" -lfmt -o "$out/${target}_fuzz"
"$out/${target}_fuzz" -max_total_time="$seconds" "${options[@]}" -rss_limit_mb=1024 -timeout=5 "$corpus" \
  2>&1 | tail -n 5
