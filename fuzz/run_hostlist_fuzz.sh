#!/usr/bin/env bash
# Builds the hostlist fuzz target with clang (libFuzzer + ASan + UBSan; torch-free, seconds)
# and fuzzes for ${1:-20} seconds from the checked-in corpus. Exits non-zero on any finding.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${VOLT_FUZZ_DIR:-$root/build/fuzz}
mkdir -p "$out/corpus"
cp -n "$root"/fuzz/corpus/hostlist/* "$out/corpus/" 2>/dev/null || true
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$root/src" "$root/fuzz/hostlist_fuzz.cpp" "$root/src/volt/slurm/hostlist.cpp" \
  "$root/src/volt/core/error.cpp" "$root/src/volt/core/strings.cpp" -lfmt -o "$out/hostlist_fuzz"
"$out/hostlist_fuzz" -max_total_time="${1:-20}" -max_len=256 -rss_limit_mb=1024 -timeout=5 "$out/corpus" \
  2>&1 | tail -n 5
