"""Reads Fashion-MNIST's IDX files for the export scripts (export-fashion-mnist-images.py and
export-fashion-mnist-npy.py), which import it from beside themselves."""
import gzip
import sys

import numpy as np


def read_idx(path):
    """The IDX file `path` (gzipped or not) as a uint8 array of its shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def find(data_dir, stem):
    """`data_dir`/`stem`.gz or `data_dir`/`stem`; exits with a hint when neither exists."""
    for name in (stem + ".gz", stem):
        if (data_dir / name).exists():
            return data_dir / name
    sys.exit(f"export: {data_dir / stem}(.gz) is missing. HINT: apt-get install dataset-fashion-mnist, or pass "
             "--data-dir with the IDX files.")
