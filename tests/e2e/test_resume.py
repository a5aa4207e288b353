"""Resume from the command line: 1 epoch, then --ckpt-path last.ckpt to 2 epochs, must end exactly
where a fresh 2-epoch run with the same seed ends."""
import pytest
import torch

from volt_e2e import DETERMINISTIC, SHORT, assert_ok, load_checkpoint, read_metrics_csv, run_binary

ARGS = ["--model", "mlp"] + SHORT + DETERMINISTIC


@pytest.fixture(scope="module")
def runs(binary, dataset, tmp_path_factory, mlp_two_epochs):
    split_root = tmp_path_factory.mktemp("resume")
    first = run_binary(binary, ARGS + ["--max-epochs", "1"], split_root)
    assert_ok(first)
    ckpt = first.version_dir(0) / "checkpoints" / "last.ckpt"
    resumed = run_binary(binary, ARGS + ["--max-epochs", "2", "--ckpt-path", str(ckpt)], split_root)
    assert_ok(resumed)
    # The fresh 2-epoch run: ARGS with --max-epochs 2 (and --log-every-n-steps 5, which changes only
    # which training steps metrics.csv holds), test_run.py's run too.
    fresh = mlp_two_epochs
    return first, resumed, fresh, ckpt


def test_resume_says_it_restored(runs):
    first, resumed, _, ckpt = runs
    assert f"Restored training state from {ckpt}" in resumed.stdout
    fields, _ = resumed.summary()
    assert fields["resumed from"] == str(ckpt)
    assert "Restored" not in first.stdout


def test_resume_continues_the_step_count(runs):
    first, resumed, fresh, _ = runs
    first_step = int(first.summary()[0]["global step"])
    assert first_step == 20
    assert int(resumed.summary()[0]["global step"]) == 2 * first_step
    assert resumed.summary()[0]["epochs completed"] == "2"
    assert int(fresh.summary()[0]["global step"]) == 2 * first_step
    # The resumed run logs only its own epoch, at steps after the first run's.
    _, rows = read_metrics_csv(resumed.version_dir(1) / "metrics.csv")
    assert rows and all(float(r["epoch"]) == 1.0 and int(r["step"]) > first_step for r in rows), rows


def test_same_seed_same_run(runs):
    """The 1-epoch run and the fresh 2-epoch run share their first epoch, weights init included."""
    first, _, fresh, _ = runs
    def val_rows(run, version):
        _, rows = read_metrics_csv(run.version_dir(version) / "metrics.csv")
        return [(r["epoch"], r["step"], r["val/loss"], r["val/acc"]) for r in rows if r["val/loss"] != ""]
    assert val_rows(first, 0) == val_rows(fresh, 0)[:1], "--seed 7 --num-threads 1 twice gave different epochs"


@pytest.mark.compat
def test_resume_matches_a_fresh_run_exactly(runs):
    _, resumed, fresh, _ = runs
    _, resumed_metrics = resumed.summary()
    _, fresh_metrics = fresh.summary()
    # The printed summary, to its full printed precision.
    assert resumed_metrics["val/loss"] == fresh_metrics["val/loss"]
    assert resumed_metrics["val/acc"] == fresh_metrics["val/acc"]
    assert resumed.test_metrics() == fresh.test_metrics()
    # metrics.csv holds shortest-round-trip values: the last epoch's validation must match to the bit.
    def last_val(run, version):
        _, rows = read_metrics_csv(run.version_dir(version) / "metrics.csv")
        return [(r["step"], r["val/loss"], r["val/acc"]) for r in rows if r["val/loss"] != ""][-1]
    assert last_val(resumed, 1) == last_val(fresh, 0)
    # And the final weights and optimizer state are identical.
    a = load_checkpoint(resumed.version_dir(1) / "checkpoints" / "last.ckpt")
    b = load_checkpoint(fresh.version_dir(0) / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == 40
    for name, tensor in b["state_dict"].items():
        assert torch.equal(a["state_dict"][name], tensor), f"{name} differs after resume"
    for index, state in b["optimizer_states"][0]["state"].items():
        for key, value in state.items():
            other = a["optimizer_states"][0]["state"][index][key]
            assert torch.equal(torch.as_tensor(other), torch.as_tensor(value)), f"Adam state {index}.{key} differs"
    assert a["lr_schedulers"] == b["lr_schedulers"]
