#!/usr/bin/env bash
# Runs clang-tidy (the checks in .clang-tidy, warnings as errors) over the torch-free sources:
# volt::core, volt::slurm, volt::environments, volt::loggers, volt::options and the `volt` tool,
# their tests included, and the headers they include. Exits non-zero if it finds anything.
# scripts/test.sh runs it after the build: 62 files, about 230 s of CPU time, so some 125 s on two
# idle cores (the files run nproc at a time).
#
# A file found clean is remembered (${VOLT_TIDY_CACHE:-~/.cache/volt/tidy}) under a key made of the
# clang-tidy version, .clang-tidy, the file's compile command and the contents of the file and of
# every header it includes (scripts/tidy-keys.py, from the build's dependency log), and is not
# checked again until one of those changes: a change costs the files it touches and the files that
# include a header it touches. VOLT_TIDY=all (or naming files) checks every file regardless.
#
# It reads ${VOLT_BUILD_DIR:-build}/compile_commands.json (CMake writes it at configure time) and
# needs the build's generated header tensorboard_event.pb.h (protoc writes it at build time), so it
# runs after the build; on its own it configures the build folder and generates that header first.
#   scripts/check-tidy.sh                          every torch-free source
#   scripts/check-tidy.sh tools/volt/cli.cpp ...   only these
# Fix a finding in the code, or, where the check is wrong for that line, silence it there with
# `// NOLINT(check-name): why`. The areas that include LibTorch are left out: each of their files
# parses all of <torch/torch.h> (no precompiled header here), some 20 s of CPU time per file, so
# their 74 files would add over 10 minutes on two cores.
set -euo pipefail
caller_dir=$PWD  # file arguments are relative to where the script was called from
cd "$(dirname "$0")/.."
root=$(pwd)
build_dir=${VOLT_BUILD_DIR:-build}
areas=(src/volt/core src/volt/slurm src/volt/environments src/volt/loggers src/volt/options tools/volt)

clang_tidy=${CLANG_TIDY:-}
if [ -z "$clang_tidy" ]; then
  clang_tidy=$(command -v clang-tidy-14 || command -v clang-tidy || true)
fi
if [ -z "$clang_tidy" ] || ! command -v "$clang_tidy" >/dev/null; then
  echo "check-tidy: clang-tidy not found. HINT: apt-get install clang-tidy (scripts/setup.sh does)" >&2
  exit 2
fi

start=$(date +%s)
if [ ! -f "$build_dir/compile_commands.json" ]; then
  echo "check-tidy: configuring $build_dir for its compile_commands.json"
  cmake -S . -B "$build_dir" -G Ninja >/dev/null
fi
if [ ! -f "$build_dir/src/volt/loggers/generated/volt/loggers/tensorboard_event.pb.h" ]; then
  echo "check-tidy: generating the TensorBoard protobuf code in $build_dir"
  cmake --build "$build_dir" --target volt_tensorboard_proto >/dev/null
fi
db="$build_dir/compile_commands.json"

if [ $# -gt 0 ]; then
  candidates=("$@")
else
  mapfile -t candidates < <(git ls-files -- "${areas[@]/%//*.cpp}" "${areas[@]/%//*.cc}")
  [ ${#candidates[@]} -gt 0 ] || { echo "check-tidy: git ls-files found no sources" >&2; exit 2; }
fi
# Only files the build compiles have flags (tests are absent with -DVOLT_BUILD_TESTS=OFF), and only
# torch-free ones are checked: a LibTorch file in these areas (tools/volt's test against
# resolve_run_plan) uses the precompiled torch header, which clang-tidy cannot read.
files=()
skipped=()
with_torch=()
for f in "${candidates[@]}"; do
  case "$f" in
    /*) abs=$(realpath -m "$f") ;;
    *) abs=$(realpath -m "$caller_dir/$f") ;;
  esac
  if ! grep -qF "\"file\": \"$abs\"" "$db"; then
    skipped+=("$f")
  elif grep -B2 -F "\"file\": \"$abs\"" "$db" | grep -qF cmake_pch; then
    with_torch+=("$f")
  else
    files+=("$abs")
  fi
done
[ ${#skipped[@]} -eq 0 ] || echo "check-tidy: not in $db, skipped: ${skipped[*]}"
[ ${#with_torch[@]} -eq 0 ] || echo "check-tidy: LibTorch sources, skipped: ${with_torch[*]}"
[ ${#files[@]} -gt 0 ] || { echo "check-tidy: nothing to check" >&2; exit 2; }

# The cache of clean results: only for whole-tree runs (files named on the command line are checked).
cache_dir=${VOLT_TIDY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/volt/tidy}
declare -A key_of=()
cached=0
if [ $# -eq 0 ] && [ "${VOLT_TIDY:-}" != all ] && mkdir -p "$cache_dir" 2>/dev/null; then
  salt="$("$clang_tidy" --version | tr -d '\n') $(sha256sum .clang-tidy | cut -d' ' -f1)"
  unchecked=()
  while read -r key file; do
    if [ "$key" != - ] && [ -e "$cache_dir/$key" ]; then
      cached=$((cached + 1))
      continue
    fi
    key_of[$file]=$key
    unchecked+=("$file")
  done < <(python3 scripts/tidy-keys.py "$build_dir" "$root" "$salt" "${files[@]}")
  if [ ${#unchecked[@]} -eq 0 ]; then
    echo "check-tidy: ${#files[@]} files clean (all unchanged since found clean; VOLT_TIDY=all checks them again)"
    exit 0
  fi
  [ $cached -eq 0 ] || echo "check-tidy: $cached of ${#files[@]} files unchanged since found clean; checking ${#unchecked[@]}"
  files=("${unchecked[@]}")
fi

# One clang-tidy per file, nproc at a time; each file's findings are kept apart and printed
# together at the end, so parallel runs do not interleave their lines.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
export clang_tidy build_dir logs
xargs_rc=0
# shellcheck disable=SC2016  # the inner script expands its own variables
printf '%s\0' "${files[@]}" | xargs -0 -n 1 -P "${VOLT_TIDY_JOBS:-$(nproc)}" bash -c '
  log="$logs/$(printf %s "$1" | tr / _).log"
  "$clang_tidy" -p "$build_dir" --quiet "$1" >"$log" 2>&1 && exit 0
  rc=$?
  { [ $rc -eq 1 ] && grep -q "error:" "$log"; } || echo "clang-tidy exited with status $rc on $1" >>"$log"
  mv "$log" "$log.failed"
' _ || xargs_rc=$?

mapfile -t failed < <(find "$logs" -name '*.failed' | sort)
elapsed=$(($(date +%s) - start))
if [ ${#failed[@]} -eq 0 ] && [ $xargs_rc -ne 0 ]; then
  echo "check-tidy: running clang-tidy failed (xargs exited with status $xargs_rc)" >&2
  exit 2
fi
for file in "${!key_of[@]}"; do
  log="$logs/$(printf %s "$file" | tr / _).log"
  if [ "${key_of[$file]}" != - ] && [ ! -e "$log.failed" ]; then touch "$cache_dir/${key_of[$file]}"; fi
done
if [ ${#failed[@]} -eq 0 ]; then
  echo "check-tidy: ${#files[@]} files clean in ${elapsed} s ($("$clang_tidy" --version | grep -o 'version [0-9.]*'))"
  exit 0
fi
# Paths relative to the checkout; without clang's "N warnings generated." (those are in headers
# outside HeaderFilterRegex, not shown).
cat "${failed[@]}" | grep -Ev '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$' | sed "s|^$root/||" >&2 || true
echo "check-tidy: findings in ${#failed[@]} of ${#files[@]} files (${elapsed} s), listed above." >&2
echo "HINT: fix them, or silence a wrong one on its line with // NOLINT(check-name); rerun" \
  "scripts/check-tidy.sh <file>... for just those files" >&2
exit 1
