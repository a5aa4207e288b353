#!/usr/bin/env bash
# Gathers into ONE ignored folder (device-pack/, or $VOLT_DEVICE_PACK) what building and checking
# Volt on a lent GPU machine needs and that machine may lack (issue #33): it has Python's CUDA
# torch, nvcc, CMake and Ninja, but no Debian -dev packages and no network. Runs HERE (Debian 12).
#
#   scripts/device/pack.sh            pack (idempotent: a packed folder costs a few dpkg queries)
#   scripts/device/pack.sh --check    only measure: fail unless the pack exists and fits
#
# What goes in:
#   debs/   Debian bookworm .deb files (apt-get download, or apt's own cache when it holds the
#           same version): the headers and CMake/pkg-config files of Volt's dependencies, and the
#           runtime libraries Volt's binaries link beyond LibTorch and glibc (read off `readelf -d`
#           and `ldd` of a CUDA build: fmt, yaml-cpp, protobuf, libpng, turbojpeg, libcurl and
#           what libcurl itself links), plus protoc and pkg-config with their libraries.
#           scripts/device/check.sh unpacks them into a prefix, never into /.
#   data/fashion-mnist/   the example's IDX files (gzip), from /usr/share/datasets/fashion-mnist
#   data/text.txt         the GPT example's text: the licenses under /usr/share/common-licenses,
#                         in a fixed order, as bench/gpt_vs_pytorch.sh reads them (256 KB)
# The run tool sends the working tree (tracked and untracked-not-ignored files) plus the ignored
# paths named in `carry`, 64 MiB in all: this script fails when the pack and the tree exceed it.
set -euo pipefail
cd "$(dirname "$0")/../.."

pack=${VOLT_DEVICE_PACK:-device-pack}
limit=$(( 64 * 1024 * 1024 ))
check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  *) echo "pack: unknown argument '$1'; expected nothing or --check. HINT: scripts/device/pack.sh packs," \
          "scripts/device/pack.sh --check only measures." >&2
     exit 2 ;;
esac

# Headers, CMake configs and tools (build time).
dev_packages=(
  libfmt-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev zlib1g-dev libpng-dev libturbojpeg0-dev
  libprotobuf-dev protobuf-compiler libprotoc32 libcurl4-openssl-dev libgtest-dev libgmock-dev
  pkgconf pkgconf-bin libpkgconf3
  libsentencepiece-dev   # examples/gpt reads SentencePiece tokenizers (gpt_sentencepiece, dlopened)
  libgloo-dev            # torch's ProcessGroupGloo.hpp includes <gloo/...>; PyPI's wheels ship no gloo headers
)
# Runtime libraries: what Volt's binaries (and protoc, pkg-config) link beyond LibTorch and glibc.
runtime_packages=(
  libfmt9 libyaml-cpp0.7 libprotobuf32 libpng16-16 libturbojpeg0 zlib1g libsentencepiece0
  libcurl4 libbrotli1 libnghttp2-14 libpsl5 librtmp1 libssh2-1 libldap-2.5-0 libsasl2-2 libidn2-0
  libunistring2 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2
  libssl3 libzstd1 libgnutls30 libhogweed6 libnettle8 libgmp10 libp11-kit0 libtasn1-6 libffi8
)

# tree_bytes: what the run tool sends beside the pack (tracked + untracked files not ignored).
tree_bytes() {
  git ls-files -z --cached --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | awk 'END {print $1}'
}

measure() {
  local tree pack_bytes total
  tree=$(tree_bytes)
  pack_bytes=$(du -sb "$pack" | cut -f1)
  total=$(( tree + pack_bytes ))
  printf 'pack: %s %.1f MiB + working tree %.1f MiB = %.1f MiB of the 64 MiB the run tool sends\n' \
    "$pack" "$(bc -l <<<"$pack_bytes/1048576")" "$(bc -l <<<"$tree/1048576")" "$(bc -l <<<"$total/1048576")"
  if [ "$total" -gt "$limit" ]; then
    echo "pack: $total bytes is over the run tool's limit of $limit bytes (64 MiB). HINT: drop a package" \
         "from the lists in scripts/device/pack.sh, or ignore large untracked files (git status shows them)." >&2
    return 1
  fi
}

if [ "$check_only" = 1 ]; then
  if [ ! -f "$pack/.complete" ]; then
    echo "pack: no complete pack at $pack (expected $pack/.complete). HINT: run scripts/device/pack.sh first." >&2
    exit 1
  fi
  measure
  exit
fi

# Inside the checkout the pack must be ignored (a build folder's, as CTest's test uses, is).
[[ "$(realpath -m "$pack")/" != "$PWD/"* ]] || git check-ignore -q "$pack/x" || {
  echo "pack: $pack is not ignored by git, so the run tool would send it twice. HINT: add /$pack/ to .gitignore." >&2
  exit 1
}
mkdir -p "$pack/debs" "$pack/data/fashion-mnist"
# As root, apt fetches as _apt, which cannot write into this checkout: fetch as root.
sandbox=()
[ "$(id -u)" -ne 0 ] || sandbox=(-o APT::Sandbox::User=root)

# The exact versions this machine's apt knows: the pack is bookworm's, whatever is installed.
stamp="bookworm ${dev_packages[*]} ${runtime_packages[*]}"
if [ "$(cat "$pack/.complete" 2>/dev/null)" != "$stamp" ]; then
  rm -f "$pack/.complete"
  all=("${dev_packages[@]}" "${runtime_packages[@]}")
  # One apt-cache query for every candidate version (a query per package costs a second each).
  mapfile -t versions < <(apt-cache policy "${all[@]}" |
    awk '/^[^ ]/ {name = $1; sub(/:$/, "", name)} /Candidate:/ {print name "=" $2}')
  fetch=()
  for p in "${all[@]}"; do
    version=""
    for v in "${versions[@]}"; do [ "${v%%=*}" != "$p" ] || version=${v#*=}; done
    if [ -z "$version" ] || [ "$version" = "(none)" ]; then
      echo "pack: apt knows no version of $p. HINT: run 'apt-get update' (as root), or check the package" \
           "name against Debian bookworm." >&2
      exit 1
    fi
    file_version=${version//:/%3a}
    if ls "$pack/debs/${p}_${file_version}"_*.deb >/dev/null 2>&1; then continue; fi
    cached=
    for f in /var/cache/apt/archives/"${p}_${file_version}"_{amd64,all}.deb; do
      if [ -f "$f" ]; then cached=$f; break; fi
    done
    if [ -n "$cached" ]; then cp "$cached" "$pack/debs/"; else fetch+=("$p=$version"); fi
  done
  if [ "${#fetch[@]}" -gt 0 ]; then
    (cd "$pack/debs" && apt-get download -q ${sandbox[@]+"${sandbox[@]}"} "${fetch[@]}" >/dev/null) || {
      echo "pack: apt-get download of ${#fetch[@]} packages (${fetch[*]:0:3} ...) failed. HINT: this needs the" \
           "network and bookworm's package lists ('apt-get update')." >&2
      exit 1
    }
  fi
  # A package dropped from the lists, or an older version left by an earlier pack, would be
  # unpacked too: keep one file per listed package.
  for f in "$pack"/debs/*.deb; do
    name=${f##*/}
    [[ " ${dev_packages[*]} ${runtime_packages[*]} " == *" ${name%%_*} "* ]] || rm -f "$f"
  done
  for p in "${dev_packages[@]}" "${runtime_packages[@]}"; do
    mapfile -t files < <(ls -t "$pack/debs/${p}"_*.deb)
    [ "${#files[@]}" -le 1 ] || rm -f "${files[@]:1}"
  done
  echo "$stamp" >"$pack/.complete"
fi

data=${VOLT_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  if [ ! -f "$data/$f" ]; then
    echo "pack: $data/$f is missing (expected Fashion-MNIST's four IDX files there). HINT: scripts/setup.sh" \
         "installs dataset-fashion-mnist, or set VOLT_FASHION_MNIST_DIR." >&2
    exit 1
  fi
  cmp -s "$data/$f" "$pack/data/fashion-mnist/$f" || cp "$data/$f" "$pack/data/fashion-mnist/$f"
done
if [ ! -s "$pack/data/text.txt" ]; then
  find /usr/share/common-licenses -maxdepth 1 -type f | sort | xargs cat >"$pack/data/text.txt.tmp"
  mv "$pack/data/text.txt.tmp" "$pack/data/text.txt"
fi

echo "pack: $(find "$pack/debs" -name '*.deb' | wc -l) .deb files, data: $(find "$pack/data/fashion-mnist" -type f | wc -l) IDX files, text.txt"
measure
