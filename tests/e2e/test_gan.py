"""examples/fashion_mnist_gan: manual optimization with two optimizers, run the way a user does.
One process and ddp train, each optimizer's step counts a global step, and a run resumed from its
last checkpoint ends bit-identical to one that never stopped."""
import os

import pytest
import torch

from volt_e2e import DETERMINISTIC, assert_ok, cluster_free_env, finite, load_checkpoint, read_metrics_csv, run_binary

ARGS = ["--no-progress-bar", "--log-every-n-steps", "2"] + DETERMINISTIC


@pytest.fixture(scope="module")
def gan():
    path = os.environ.get("VOLT_GAN_EXAMPLE")
    if not path:
        pytest.fail("VOLT_GAN_EXAMPLE is not set; run through CTest, or export "
                    "VOLT_GAN_EXAMPLE=/path/to/build/examples/fashion_mnist_gan")
    return path


def last_checkpoint(run):
    return run.version_dir(0) / "checkpoints" / "last.ckpt"


def test_the_gan_resumed_from_its_last_checkpoint_ends_bit_identical(gan, dataset, tmp_path):
    straight = run_binary(gan, ARGS + ["--max-steps", "40"], tmp_path / "straight")
    assert_ok(straight)
    # Two optimizers stepped per batch: 40 global steps are 20 batches.
    assert int(straight.summary()[0]["global step"]) == 40
    _, rows = read_metrics_csv(straight.version_dir(0) / "metrics.csv")
    logged = [r for r in rows if r.get("train/g_loss_step", "") != ""]
    assert logged and all(finite(r["train/g_loss_step"]) and finite(r["train/d_loss_step"]) for r in logged)

    first = run_binary(gan, ARGS + ["--max-steps", "20"], tmp_path / "split")
    assert_ok(first)
    resumed = run_binary(gan, ARGS + ["--max-steps", "40", "--ckpt-path", str(last_checkpoint(first))],
                         tmp_path / "split")
    assert_ok(resumed)
    expected = load_checkpoint(last_checkpoint(straight))
    got = load_checkpoint(resumed.version_dir(1) / "checkpoints" / "last.ckpt")
    assert got["global_step"] == expected["global_step"] == 40
    assert expected["state_dict"].keys() == got["state_dict"].keys()
    for name, value in expected["state_dict"].items():
        assert torch.equal(value, got["state_dict"][name]), name
    # Both optimizers' states (Adam's moments) resume too.
    assert len(got["optimizer_states"]) == 2


def test_the_gan_trains_under_ddp(gan, dataset, tmp_path):
    run = run_binary(gan, ARGS + ["--max-steps", "20", "--strategy", "ddp", "--devices", "2"], tmp_path,
                     env=cluster_free_env(OMP_NUM_THREADS="1"))
    assert_ok(run)
    assert int(run.summary()[0]["global step"]) == 20
    fields, metrics = run.summary()
    assert finite(metrics["train/g_loss_epoch"]) and finite(metrics["train/d_loss_epoch"]), run
