#!/usr/bin/python3
"""Exports Fashion-MNIST's IDX files as PNG images in the folder layout torchvision's ImageFolder
(and volt::datasets::ImageFolder) reads:

    OUT/train/<label>-<class>/<index>.png   60000 images
    OUT/test/<label>-<class>/<index>.png    10000 images

Folder names start with the label, so that sorting them (as ImageFolder does) gives back the
IDX files' labels. Then `fashion_mnist --data-dir OUT` trains from the images, decoding them per
batch. Needs Debian's python3-numpy and python3-pil.

    scripts/export-fashion-mnist-images.py /tmp/fashion-png
    scripts/export-fashion-mnist-images.py /tmp/small --limit 1000    # the first 1000 of each split
"""
import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from fashion_mnist_idx import find, read_idx

CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
           "Ankle_boot"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write train/ and test/ into")
    parser.add_argument("--data-dir", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--limit", type=int, default=None, help="export only the first N images of each split")
    args = parser.parse_args()
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(find(args.data_dir, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(find(args.data_dir, f"{prefix}-labels-idx1-ubyte"))
        count = len(images) if args.limit is None else min(args.limit, len(images))
        for label, name in enumerate(CLASSES):
            (args.out / split / f"{label}-{name}").mkdir(parents=True, exist_ok=True)
        for i in range(count):
            label = int(labels[i])
            Image.fromarray(images[i], mode="L").save(args.out / split / f"{label}-{CLASSES[label]}" / f"{i:05d}.png")
        print(f"export: {count} {split} images in {args.out / split}")


if __name__ == "__main__":
    main()
