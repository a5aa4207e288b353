"""The example trained from .npy shards read as a stream (volt::datasets::NpyShards):
scripts/export-fashion-mnist-npy.py writes Fashion-MNIST as shards, and `--data-dir` on that
folder streams them. A synthetic data set larger than the process ever holds trains in one epoch."""
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from volt_e2e import DETERMINISTIC, assert_ok, run_binary

EXPORT = Path(__file__).resolve().parents[2] / "scripts" / "export-fashion-mnist-npy.py"
ARGS = ["--model", "mlp", "--max-epochs", "1", "--no-progress-bar", "--examples-per-shard", "250"] + DETERMINISTIC


@pytest.fixture(scope="module")
def small_shards(dataset, tmp_path_factory):
    """3000 training images (500 of them in val/) and 3000 test images, 1000 per file."""
    out = tmp_path_factory.mktemp("npy")
    export = subprocess.run([str(EXPORT), str(out), "--limit", "3000", "--val-size", "500", "--per-file", "1000"],
                            capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr
    assert np.load(out / "train" / "data-00000.npy").shape == (1000, 28, 28)
    assert np.load(out / "train" / "target-00002.npy").shape == (500,)
    return out


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.compat)])
def test_trains_from_npy_shards_with_workers(binary, small_shards, tmp_path, processes):
    run = run_binary(binary, ARGS + ["--data-dir", str(small_shards), "--num-workers", "2", "--strategy", "ddp",
                                     "--devices", str(processes)], tmp_path)
    assert_ok(run)
    assert float(run.test_metrics()["test/acc"]) > 0.5, run  # 10 classes: chance is 0.1
    assert "val/acc" in run.stdout, run


def test_a_fraction_of_a_stream_is_refused_with_a_hint(binary, small_shards, tmp_path):
    run = run_binary(binary, ARGS + ["--data-dir", str(small_shards), "--limit-train-batches", "0.5"], tmp_path)
    assert run.returncode != 0
    assert "limit_train_batches=0.5 is a fraction of an epoch, but the data is a stream" in run.stderr, run
    assert "HINT: give a number of batches instead" in run.stderr, run


def test_a_truncated_shard_is_named(binary, small_shards, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(small_shards, broken)
    shard = broken / "train" / "data-00001.npy"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 100)
    run = run_binary(binary, ARGS + ["--data-dir", str(broken)], tmp_path / "run")
    assert run.returncode != 0
    assert f"{shard} is cut short" in run.stderr, run
    assert "HINT:" in run.stderr


def peak_rss(args, out):
    """Runs the example with `args` (writing its output into the folder `out`); returns its peak
    resident memory in bytes and its stdout."""
    out.mkdir()
    with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
        proc = subprocess.Popen(args + ["--default-root-dir", str(out / "run")], stdout=stdout, stderr=stderr)
        # wait4 on the child alone: its own peak, not that of the test's other children.
        _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (out / "stderr").read_text()
    return usage.ru_maxrss * 1024, (out / "stdout").read_text()


@pytest.mark.slow
def test_a_data_set_larger_than_the_process_holds_trains_in_bounded_memory(binary, tmp_path):
    """1,024,000 synthetic 28x28 images in eight 98 MB shards: 785 MB as uint8, 3.2 GB as the
    float tensors an in-memory data set holds. The whole epoch trains while the process's peak
    resident memory grows by well less than the data it reads beyond a baseline: the same run over
    the first two of those shards (the memory maps give their pages back). The baseline, measured
    beside it, takes out what does not depend on the data: LibTorch, the model, the loader's
    buffers, and malloc's per-thread arenas, which hold more on a loaded machine (the whole peak
    was 238 MB on an idle 2-core machine and up to 436 MB while the rest of the suite ran beside
    it)."""
    data = tmp_path / "data"
    small = tmp_path / "small"  # the first two training shards and the same test shard, linked
    rng = np.random.default_rng(0)
    for split, files, per_file in (("train", 8, 128000), ("test", 1, 2000)):
        (data / split).mkdir(parents=True)
        (small / split).mkdir(parents=True)
        for n in range(files):
            x = rng.integers(0, 256, size=(per_file, 28, 28), dtype=np.uint8)
            # A learnable label: the brightness of the top rows.
            y = np.clip(x[:, :2, :].mean(axis=(1, 2)) // 26, 0, 9).astype(np.int64)
            for name, array in ((f"data-{n:05d}.npy", x), (f"target-{n:05d}.npy", y)):
                np.save(data / split / name, array)
                if n < 2:
                    os.link(data / split / name, small / split / name)
    data_bytes = sum(f.stat().st_size for f in (data / "train").glob("data-*.npy"))
    small_bytes = sum(f.stat().st_size for f in (small / "train").glob("data-*.npy"))
    # What is measured is the reading, not the model: a hidden width of 8, batches of 2048 and one
    # intra-op thread train the epoch in a fraction of the CPU time the default MLP took (batches of
    # 512 and 256 hidden units: over 5 minutes of CPU beside the rest of the suite).
    args = [binary, "--model", "mlp", "--hidden", "8", "--max-epochs", "1", "--batch-size", "2048", "--num-workers",
            "2", "--num-threads", "1", "--no-progress-bar"]
    start = time.monotonic()
    baseline, stdout = peak_rss(args + ["--data-dir", str(small)], tmp_path / "baseline")
    assert "stopped: max_epochs after 1 epoch" in stdout, stdout
    peak, stdout = peak_rss(args + ["--data-dir", str(data)], tmp_path / "whole")
    assert "after 1 epoch (500 steps)" in stdout, stdout
    grown, more_data = peak - baseline, data_bytes - small_bytes
    print(f"{data_bytes / 2**20:.0f} MB of shards trained in {time.monotonic() - start:.0f} s (with the baseline) "
          f"with a peak RSS of {peak / 2**20:.0f} MB, {grown / 2**20:.0f} MB above the baseline's over "
          f"{small_bytes / 2**20:.0f} MB")
    # Held in memory, the 6 more shards would add at least their 589 MB; paged out, nothing.
    assert grown < 0.5 * more_data, f"peak RSS {peak / 2**20:.0f} MB, {grown / 2**20:.0f} MB above the baseline " \
        f"for {more_data / 2**20:.0f} MB more data"
