#!/usr/bin/python3
"""Exports Fashion-MNIST's IDX files as .npy shards, the layout volt::datasets::NpyShards reads:

    OUT/train/data-00000.npy  uint8 [N, 28, 28]    OUT/train/target-00000.npy  int64 [N]
    OUT/val/...    the --val-size examples held out of the 60000 (a fixed permutation, seed 42)
    OUT/test/...   the 10000 test images

Shards hold --per-file examples each. Then `fashion_mnist --data-dir OUT` trains from them as a
stream. Needs Debian's python3-numpy.

    scripts/export-fashion-mnist-npy.py /tmp/fashion-npy
    scripts/export-fashion-mnist-npy.py /tmp/small --limit 2000 --per-file 500
"""
import argparse
import sys
from pathlib import Path

import numpy as np

from fashion_mnist_idx import find, read_idx


def write(folder, images, labels, per_file):
    folder.mkdir(parents=True, exist_ok=True)
    for n, start in enumerate(range(0, len(images), per_file)):
        np.save(folder / f"data-{n:05d}.npy", np.ascontiguousarray(images[start:start + per_file]))
        np.save(folder / f"target-{n:05d}.npy", labels[start:start + per_file].astype(np.int64))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write train/, val/ and test/ into")
    parser.add_argument("--data-dir", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--limit", type=int, default=None, help="export only the first N images of each split")
    parser.add_argument("--val-size", type=int, default=5000, help="training images held out into val/ (0: none)")
    parser.add_argument("--per-file", type=int, default=10000, help="examples per .npy file")
    args = parser.parse_args()
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(find(args.data_dir, f"{prefix}-images-idx3-ubyte"))[:args.limit]
        labels = read_idx(find(args.data_dir, f"{prefix}-labels-idx1-ubyte"))[:args.limit]
        if split == "train" and args.val_size > 0:
            if args.val_size >= len(images):
                sys.exit(f"export: --val-size {args.val_size} leaves no training images of {len(images)}. "
                         "HINT: hold out fewer.")
            order = np.random.default_rng(42).permutation(len(images))
            held = np.sort(order[:args.val_size])
            kept = np.sort(order[args.val_size:])
            write(args.out / "val", images[held], labels[held], args.per_file)
            images, labels = images[kept], labels[kept]
        write(args.out / split, images, labels, args.per_file)
        print(f"{split}: {len(images)} examples in {args.out / split}")


if __name__ == "__main__":
    main()
