"""A short run of the example: what it prints, the logs and checkpoints it leaves, and that Python's
torch reads the checkpoint into exactly the model the binary tested."""
import gzip
import json
import math
import re

import numpy as np
import pytest
import torch
import yaml

from volt_e2e import (ALLOWED_GLOBALS, DETERMINISTIC, SHORT, assert_ok, cluster_free_env, finite, load_checkpoint,
                      pickle_globals, read_metrics_csv, run_binary)

MLP_SHAPES = {
    "net.1.weight": (256, 784), "net.1.bias": (256,),
    "net.3.weight": (256, 256), "net.3.bias": (256,),
    "net.5.weight": (10, 256), "net.5.bias": (10,),
}
CHECKPOINT_KEYS = {"epoch", "global_step", "state_dict", "optimizer_states", "lr_schedulers", "loops",
                   "callbacks", "hyper_parameters", "volt_version"}
TOP_K_NAME = re.compile(r"^epoch=(\d+)-step=(\d+)-val_acc=(\d\.\d{4})\.ckpt$")


@pytest.fixture(scope="module")
def first(mlp_two_epochs):
    """`--model mlp --max-epochs 2` on 20 batches per epoch (conftest.py's, shared with
    test_resume.py); the root gets a second run later."""
    return mlp_two_epochs


def test_prints_fit_summary_and_test_table(first):
    fields, metrics = first.summary()
    assert fields["stop reason"] == "max_epochs"
    assert fields["epochs completed"] == "2"
    assert fields["global step"] == "40"
    assert fields["log dir"].endswith("lightning_logs/version_0")
    assert fields["last checkpoint"].endswith("checkpoints/last.ckpt")
    assert TOP_K_NAME.match(fields["best checkpoint"].rsplit("/", 1)[-1]), fields["best checkpoint"]
    for name in ("train/loss_epoch", "val/acc", "val/loss"):
        assert finite(metrics[name]), (name, metrics)
    assert 0.0 <= float(metrics["val/acc"]) <= 1.0

    test = first.test_metrics()
    assert set(test) == {"test/acc", "test/loss"}, test
    assert 0.5 < float(test["test/acc"]) <= 1.0, "20 batches of Adam should already beat chance by far"
    assert math.isfinite(float(test["test/loss"]))
    assert re.search(r"^stopped: max_epochs after 2 epochs \(40 steps\) in [\d.]+ s;", first.stdout, re.M)


def test_writes_metrics_csv(first):
    columns, rows = read_metrics_csv(first.version_dir(0) / "metrics.csv")
    for column in ("train/loss_step", "train/loss_epoch", "val/acc", "val/loss", "epoch", "step"):
        assert column in columns, columns
    assert rows
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps), f"steps go backwards: {steps}"
    # --log-every-n-steps 5 over 40 steps: train/loss_step at 5, 10, ..., 40.
    step_rows = [r for r in rows if r["train/loss_step"] != ""]
    assert [int(r["step"]) for r in step_rows] == list(range(5, 41, 5))
    val_rows = [r for r in rows if r["val/acc"] != ""]
    assert [float(r["epoch"]) for r in val_rows] == [0.0, 1.0]
    assert [int(r["step"]) for r in val_rows] == [20, 40]
    for row in rows:
        assert float(row["epoch"]) in (0.0, 1.0), row
        for name, value in row.items():
            if value != "":
                assert finite(value), (name, value, row)
    for row in val_rows:
        assert 0.0 <= float(row["val/acc"]) <= 1.0


def test_writes_hparams_yaml(first):
    hparams = yaml.safe_load((first.version_dir(0) / "hparams.yaml").read_text())
    assert hparams["model"] == "mlp"
    assert hparams["lr"] == pytest.approx(1e-3)
    assert hparams["batch_size"] == 64
    assert hparams["hidden"] == 256


def test_writes_last_and_top_k_checkpoints(first):
    checkpoints = first.version_dir(0) / "checkpoints"
    names = sorted(p.name for p in checkpoints.iterdir())
    assert "last.ckpt" in names, names
    top_k = [n for n in names if TOP_K_NAME.match(n)]
    assert len(top_k) == 1, f"--save-top-k 1 keeps one ranked checkpoint: {names}"
    assert set(names) == {"last.ckpt", top_k[0]}, f"stray files (temporary files left behind?): {names}"
    epoch, step, _ = TOP_K_NAME.match(top_k[0]).groups()
    assert (int(epoch), int(step)) in ((0, 20), (1, 40))


def test_second_run_in_same_root_creates_version_1(binary, first):
    run = run_binary(binary, ["--model", "mlp", "--max-epochs", "1", "--limit-train-batches", "2",
                              "--limit-val-batches", "1", "--limit-test-batches", "1", "--no-progress-bar",
                              "--num-threads", "1"], first.root)
    assert_ok(run)
    assert run.version_dir(1).is_dir()
    assert (run.version_dir(1) / "metrics.csv").is_file()
    assert (run.version_dir(1) / "checkpoints" / "last.ckpt").is_file()
    assert run.summary()[0]["log dir"].endswith("lightning_logs/version_1")
    # The first run's files are untouched.
    assert (first.version_dir(0) / "checkpoints" / "last.ckpt").is_file()


# ---- the checkpoint, read by Python ------------------------------------------------------------


def walk_plain(value, path="ckpt"):
    """Asserts that `value` holds only plain Python values and tensors."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, (str, int)), f"{path}: key {key!r} is a {type(key)}"
            walk_plain(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            walk_plain(item, f"{path}[{i}]")
    else:
        assert value is None or isinstance(value, (str, int, float, bool, torch.Tensor)), \
            f"{path} is a {type(value)}"


@pytest.fixture(scope="module")
def last_ckpt(first):
    return first.version_dir(0) / "checkpoints" / "last.ckpt"


@pytest.mark.compat
def test_python_reads_checkpoint_as_plain_values(last_ckpt):
    ckpt = load_checkpoint(last_ckpt)
    walk_plain(ckpt)
    assert CHECKPOINT_KEYS <= set(ckpt), sorted(ckpt)
    assert ckpt["epoch"] == 1
    assert ckpt["global_step"] == 40
    assert isinstance(ckpt["volt_version"], str)
    assert {k: tuple(v.shape) for k, v in ckpt["state_dict"].items()} == MLP_SHAPES
    assert all(v.dtype == torch.float32 for v in ckpt["state_dict"].values())
    assert ckpt["hyper_parameters"]["model"] == "mlp"
    assert len(ckpt["optimizer_states"]) == 1
    adam = ckpt["optimizer_states"][0]
    assert {"state", "param_groups"} <= set(adam), sorted(adam)  # PyTorch's layout (+ Volt's "volt_optimizer")
    assert len(adam["state"]) == 6
    assert adam["param_groups"][0]["lr"] == pytest.approx(1e-3 * 0.5 ** 2)  # StepLR halved it twice
    assert len(ckpt["lr_schedulers"]) == 1
    assert ckpt["loops"]["fit_loop"]["global_step"] == 40


def test_checkpoint_pickle_references_only_torch_save_globals(last_ckpt):
    found = pickle_globals(last_ckpt)
    for module, name in found:
        assert (module, name) in ALLOWED_GLOBALS or (module == "torch" and name.endswith("Storage")), \
            f"unexpected pickle global {module}.{name} (all: {sorted(found)})"
    assert ("torch._utils", "_rebuild_tensor_v2") in found


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

    def forward(self, x):
        return self.net(x)


@pytest.mark.compat
def test_checkpoint_holds_the_tested_model(first, last_ckpt, dataset):
    """Python's copy of the MLP, loaded from last.ckpt, scores what the binary printed on the same
    3 test batches of 256 (the test split in order)."""
    n = 3 * 256
    images = read_idx(dataset / "t10k-images-idx3-ubyte.gz")[:n]
    labels = torch.from_numpy(read_idx(dataset / "t10k-labels-idx1-ubyte.gz")[:n].astype(np.int64))
    x = (torch.from_numpy(images.astype(np.float32)) / 255 - 0.2860) / 0.3530
    x = x.unsqueeze(1)

    model = Mlp()
    model.load_state_dict(load_checkpoint(last_ckpt)["state_dict"], strict=True)
    model.eval()
    with torch.no_grad():
        logits = model(x)
    correct = int((logits.argmax(1) == labels).sum())
    top2 = logits.topk(2, dim=1).values
    near_ties = int(((top2[:, 0] - top2[:, 1]) < 1e-4).sum())  # BLAS rounding may flip these

    printed = float(first.test_metrics()["test/acc"])
    assert abs(correct / n - printed) <= 1e-6 + near_ties / n, \
        f"Python scores {correct}/{n} = {correct / n:.6g}, the binary printed test/acc={printed}"
    # And the loss, to the printed 6 digits (rounding differences aside).
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    assert loss == pytest.approx(float(first.test_metrics()["test/loss"]), rel=1e-4)


def test_worker_threads_change_nothing_but_when_batches_are_made(binary, dataset, first, tmp_path):
    """--num-workers 3: the same steps, metrics and weights as the run without workers."""
    run = run_binary(binary, ["--model", "mlp", "--max-epochs", "2", "--log-every-n-steps", "5", "--num-workers", "3"] +
                     SHORT + DETERMINISTIC, tmp_path)
    assert_ok(run)
    assert run.test_metrics() == first.test_metrics()
    ours = load_checkpoint(run.version_dir() / "checkpoints" / "last.ckpt")["state_dict"]
    theirs = load_checkpoint(first.version_dir() / "checkpoints" / "last.ckpt")["state_dict"]
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


def test_auto_scale_batch_size_and_auto_lr_find_tune_before_training(binary, tmp_path):
    """The seed documents' flags: the batch size under a memory limit, then the learning rate."""
    # 10 MB: the search ends at a batch of a few hundred, and the sweep's 100 steps and the epoch
    # run on that batch (at 100 MB, ~8000: the same search and sweep at 6 times the cost).
    run = run_binary(binary, ["--model", "mlp", "--max-epochs", "1", "--auto-scale-batch-size", "binsearch",
                              "--tune-max-memory-mb", "10", "--auto-lr-find"] + SHORT + DETERMINISTIC, tmp_path)
    assert_ok(run)
    size = int(re.search(r"auto_scale_batch_size: training with batch size (\d+)", run.stdout).group(1))
    lr = float(re.search(r"auto_lr_find: training with lr ([0-9.e+-]+)", run.stdout).group(1))
    assert 2 <= size < 54000, run  # under the limit, below the whole training split
    rows = (tmp_path / "lr_find.csv").read_text().splitlines()
    assert rows[0] == "step,lr,loss,suggested" and len(rows) > 20, rows[:3]
    sweep = [row.split(",") for row in rows[1:]]
    assert [int(step) for step, _, _, _ in sweep] == list(range(len(sweep)))
    # The example sweeps with LrFindOptions' defaults: 100 steps from 1e-8 towards 1, exponentially
    # (step i: 1e-8 * 1e8 ** (i / 100)), stopping early once the loss diverges.
    assert len(sweep) <= 100
    for step, step_lr, _, _ in sweep:
        assert float(step_lr) == pytest.approx(1e-8 * 1e8 ** (int(step) / 100), rel=1e-8), (step, step_lr)
    # The suggestion: the steepest descent of the smoothed loss (numpy.gradient), leaving out the
    # first 10 steps and the last one, and any non-finite loss.
    kept = [i for i in range(10, len(sweep) - 1) if math.isfinite(float(sweep[i][2]))]
    slopes = np.gradient(np.array([float(sweep[i][2]) for i in kept]))
    suggested = kept[int(np.argmin(slopes))]
    assert [int(s) for _, _, _, s in sweep] == [int(i == suggested) for i in range(len(sweep))], sweep
    expected = 1e-8 * 1e8 ** (suggested / 100)
    assert lr == pytest.approx(expected, rel=1e-5), run  # printed with 6 digits
    hparams = yaml.safe_load((run.version_dir() / "hparams.yaml").read_text())
    assert hparams["batch_size"] == size, hparams  # the run trained with what the tuner found
    assert hparams["lr"] == pytest.approx(expected, rel=1e-9), hparams


def test_the_tuner_refuses_a_distributed_run_with_a_hint(binary, tmp_path):
    run = run_binary(binary, ["--model", "mlp", "--auto-lr-find", "--devices", "2", "--strategy", "ddp"] + SHORT,
                     tmp_path, env=cluster_free_env())
    assert run.returncode == 1, run
    assert "lr_find runs in one process" in run.stderr and "HINT:" in run.stderr, run


@pytest.mark.compat
def test_profiler_simple_and_pytorch_write_their_reports_beside_the_logs(binary, tmp_path):
    run = run_binary(binary, ["--model", "mlp", "--max-epochs", "1", "--profiler", "pytorch", "--no-test"] + SHORT,
                     tmp_path)
    assert_ok(run)
    assert "Training step breakdown" in run.stdout, run
    report = (run.version_dir() / "profile-fit-rank0.txt").read_text()
    assert "gradient_sync_wait" not in report and "forward" in report, report
    trace = json.loads((run.version_dir() / "trace-fit-rank0.json").read_text())
    names = {event.get("name") for event in (trace if isinstance(trace, list) else trace["traceEvents"])}
    assert {"volt/train_step", "volt/forward", "volt/backward"} <= names, sorted(n for n in names if n)[:40]
