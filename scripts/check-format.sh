#!/usr/bin/env bash
# Checks that every git-tracked C++ file (*.h, *.cpp, *.cc) is formatted as .clang-format says;
# exits non-zero naming the files that are not. scripts/test.sh runs it before the build, so an
# unformatted change fails CI in seconds.
#   scripts/check-format.sh          check only
#   scripts/check-format.sh --fix    reformat the offending files in place (clang-format -i)
# The tree is formatted with Debian 12's clang-format 14; another major version may format some
# lines differently. CLANG_FORMAT=/path/to/clang-format picks the binary.
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
case "${1:-}" in
  "") ;;
  --fix) fix=1 ;;
  -h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "check-format: unknown argument '$1' (expected none or --fix)" >&2; exit 2 ;;
esac

clang_format=${CLANG_FORMAT:-}
if [ -z "$clang_format" ]; then
  clang_format=$(command -v clang-format-14 || command -v clang-format || true)
fi
if [ -z "$clang_format" ] || ! command -v "$clang_format" >/dev/null; then
  echo "check-format: clang-format not found. HINT: apt-get install clang-format (scripts/setup.sh does)" >&2
  exit 2
fi
version=$("$clang_format" --version)
case "$version" in
  *"version 14."*) ;;
  *) echo "check-format: warning: $version; the tree is formatted with clang-format 14 (Debian 12)," \
       "so some differences below may be the version's, not yours" >&2 ;;
esac

# The file list comes from git, so build folders and generated code are never looked at. Read it
# from a file, not a pipe, so that a failing git (no repository, "dubious ownership") stops here.
list=$(mktemp)
trap 'rm -f "$list"' EXIT
if ! git ls-files -z -- '*.h' '*.cpp' '*.cc' >"$list"; then
  echo "check-format: cannot list the tracked files (git ls-files failed; is this a git checkout?)" >&2
  exit 2
fi
files=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] && files+=("$f")  # skip files deleted in the work tree but not yet in the index
done <"$list"
if [ ${#files[@]} -eq 0 ]; then
  echo "check-format: no C++ files found by git ls-files" >&2
  exit 2
fi

# clang-format prints one "file:line:col: error: code should be clang-formatted" per difference;
# keep the file names. A failure that names no file (a broken .clang-format) is shown as it is.
set +e
out=$(printf '%s\0' "${files[@]}" | xargs -0 "$clang_format" --dry-run -Werror 2>&1)
rc=$?
set -e
if [ $rc -eq 0 ]; then
  echo "check-format: ${#files[@]} files formatted ($("$clang_format" --version | grep -o 'version [0-9.]*'))"
  exit 0
fi
mapfile -t bad < <(printf '%s\n' "$out" | sed -n 's/^\(.*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u)
if [ ${#bad[@]} -eq 0 ]; then
  printf '%s\n' "$out" >&2
  echo "check-format: clang-format failed (exit $rc) without naming an unformatted file" >&2
  exit 2
fi

if [ $fix -eq 1 ]; then
  "$clang_format" -i -- "${bad[@]}"
  printf 'check-format: reformatted %s\n' "${bad[@]}"
  exit 0
fi
printf '%s\n' "$out" | head -n 40 >&2
echo "check-format: ${#bad[@]} of ${#files[@]} files not formatted as .clang-format says:" >&2
printf '  %s\n' "${bad[@]}" >&2
echo "HINT: run scripts/check-format.sh --fix (or: clang-format -i \$(git ls-files '*.h' '*.cpp' '*.cc'))," \
  "then commit the result" >&2
exit 1
