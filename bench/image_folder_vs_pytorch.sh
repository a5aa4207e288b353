#!/usr/bin/env bash
# Training throughput from PNG files: Volt's ImageFolder with k loader threads against PyTorch's
# DataLoader(torchvision ImageFolder, num_workers=k), the same MLP, batch, optimizer and 1 intra-op
# thread, on the same LibTorch (Debian's 1.13), run one after the other, k = 0, 2 and 4.
#
#   bench/image_folder_vs_pytorch.sh                     # exports Fashion-MNIST's PNGs first
#   VOLT_IMAGE_FOLDER=/tmp/fashion-png bench/image_folder_vs_pytorch.sh
# Prints each contender's line and, per k, the ratio of Volt's samples/s to PyTorch's (target >= 1.5).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${VOLT_BUILD_DIR:-build}
steps=${VOLT_BENCH_STEPS:-300}
folder=${VOLT_IMAGE_FOLDER:-/tmp/volt-fashion-png}
if [ ! -d "$folder/train" ]; then scripts/export-fashion-mnist-images.py "$folder" >/dev/null; fi
export OMP_NUM_THREADS=1
for k in ${VOLT_BENCH_WORKERS:-0 2 4}; do
  volt=$("$build/bench/bench_image_folder" --folder "$folder/train" --workers "$k" --steps "$steps")
  torch=$(/usr/bin/python3 bench/pytorch_image_folder.py --folder "$folder/train" --workers "$k" --steps "$steps")
  echo "$volt"
  echo "$torch"
  v=$(sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p' <<<"$volt")
  p=$(sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p' <<<"$torch")
  echo "workers=$k volt/pytorch samples_per_s ratio=$(awk -v v="$v" -v p="$p" 'BEGIN { printf "%.2f", v / p }')"
done
