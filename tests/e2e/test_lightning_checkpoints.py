"""Lightning's checkpoints, both ways: PyTorch Lightning 1.9.5 and 2.2.5 (PyPI, on Debian's torch)
load and resume a Volt checkpoint, Volt resumes their checkpoints, and the example's --weights
loads weights only from either, or from a torch.save'd state_dict. Lightning runs in its own
process (lightning_peer.py), with the folder scripts/setup.sh installs it into on PYTHONPATH.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from volt_e2e import DETERMINISTIC, SHORT, assert_ok, load_checkpoint, run_binary

# Lightning's version -> the folder it is installed in.
LIGHTNING = {
    "1.9.5": Path(os.environ.get("VOLT_LIGHTNING_PYTHONPATH", "/opt/volt/python-lightning")),
    "2.2.5": Path(os.environ.get("VOLT_LIGHTNING2_PYTHONPATH", "/opt/volt/python-lightning2")),
}
PEER = Path(__file__).with_name("lightning_peer.py")
TORCH2_PYTHONPATH = Path(os.environ.get("VOLT_TORCHRUN_PYTHONPATH", "/opt/volt/python-torchrun"))

MLP = ["--model", "mlp", "--hidden", "32"]


def peer(*args, lightning="1.9.5", timeout=300):
    """Runs lightning_peer.py under Lightning `lightning` and returns the JSON object it printed last."""
    folder = LIGHTNING[lightning]
    if not (folder / "pytorch_lightning").is_dir():
        pytest.fail(f"PyTorch Lightning {lightning} is not installed in {folder}: run scripts/setup.sh")
    env = dict(os.environ, PYTHONPATH=str(folder), PYTHONWARNINGS="ignore")
    run = subprocess.run(["/usr/bin/python3", str(PEER), *map(str, args)], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert run.returncode == 0, f"lightning_peer.py {args} (Lightning {lightning}) failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def train_volt(binary, root):
    """One epoch of the example, with early stopping (so both callbacks have state), then its test."""
    run = run_binary(binary, MLP + ["--max-epochs", "1", "--early-stopping-patience", "3"] + SHORT + DETERMINISTIC,
                     root)
    assert_ok(run)
    return run


@pytest.fixture(scope="module")
def volt_run(binary, tmp_path_factory):
    """A Volt run whose files the tests only read."""
    return train_volt(binary, tmp_path_factory.mktemp("volt"))


@pytest.mark.parametrize("lightning", sorted(LIGHTNING))
@pytest.mark.compat
def test_lightning_loads_and_resumes_a_volt_checkpoint(lightning, binary, dataset, tmp_path):
    # Lightning writes into the checkpoint folder it resumes (ModelCheckpoint's dirpath must match
    # for its bookkeeping to be restored): a run of this test's own.
    volt_run = train_volt(binary, tmp_path / "volt")
    last = volt_run.version_dir() / "checkpoints" / "last.ckpt"
    ours = load_checkpoint(last)
    seen = peer("resume", last, volt_run.version_dir() / "checkpoints", lightning=lightning)
    assert seen["lightning"] == lightning

    assert seen["hparams"]["hidden"] == 32 and seen["weights_equal"], seen
    # It goes on at the next epoch, with the step count, Adam's state and the decayed lr Volt left.
    assert seen["epochs_trained"] == [1], seen
    assert seen["current_epoch"] == 1 and seen["global_step"] == ours["global_step"] == 20, seen
    assert seen["adam_steps"] == [20.0], seen
    assert seen["lr"] == ours["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(5e-4), seen
    assert seen["scheduler_last_epoch"] == ours["lr_schedulers"][0]["last_epoch"] == 1, seen
    # The callbacks' state: same keys on both sides, so Lightning found and restored them.
    volt_best = [state for key, state in ours["callbacks"].items() if key.startswith("ModelCheckpoint")][0]
    assert seen["best_model_path"] == volt_best["best_model_path"] != "", seen
    assert seen["best_model_score"] == pytest.approx(float(volt_best["best_model_score"])), seen
    volt_stopping = [state for key, state in ours["callbacks"].items() if key.startswith("EarlyStopping")][0]
    assert seen["early_stopping_best_score"] == pytest.approx(float(volt_stopping["best_score"])), seen
    assert seen["final_global_step"] == 24, seen  # 4 batches of Lightning's own epoch 1


@pytest.mark.parametrize("lightning", sorted(LIGHTNING))
@pytest.mark.compat
def test_volt_resumes_a_lightning_checkpoint(lightning, binary, dataset, tmp_path):
    trained = peer("train", tmp_path / "lightning", lightning=lightning)
    assert trained["lightning"] == lightning
    assert trained["global_step"] == 4
    run = run_binary(binary, MLP + ["--max-epochs", "2", "--no-test", "--ckpt-path", trained["checkpoint"]] + SHORT +
                     DETERMINISTIC, tmp_path / "volt")
    assert_ok(run)
    assert f"Restored training state from {trained['checkpoint']}" in run.stdout, run
    summary, _ = run.summary()
    assert summary["global step"] == "24", run  # Lightning's 4, then Volt's epoch 1 of 20 batches
    ours = load_checkpoint(run.version_dir() / "checkpoints" / "last.ckpt")
    assert ours["epoch"] == 1
    adam = ours["optimizer_states"][0]
    assert {float(state["step"]) for state in adam["state"].values()} == {24.0}
    assert ours["lr_schedulers"][0]["last_epoch"] == 2
    assert adam["param_groups"][0]["lr"] == pytest.approx(2.5e-4)


def test_weights_only_from_volt_lightning_or_a_state_dict(binary, volt_run, dataset, tmp_path):
    import torch

    def test_metrics(weights, *extra):
        run = run_binary(binary, MLP + ["--no-train", "--weights", str(weights), *extra] + SHORT + DETERMINISTIC,
                         tmp_path / f"test-{Path(weights).name}")
        assert_ok(run)
        return run.test_metrics()

    # Volt's last checkpoint holds the weights its run tested at the end.
    assert test_metrics(volt_run.version_dir() / "checkpoints" / "last.ckpt") == volt_run.test_metrics()
    # A Lightning checkpoint (Lightning trained on from Volt's), and the same weights as a plain
    # torch.save(state_dict): the same metrics, which differ from Volt's.
    lightning = Path(peer("resume", volt_run.version_dir() / "checkpoints" / "last.ckpt", tmp_path / "lt")["last"])
    plain = tmp_path / "plain.pt"
    torch.save(torch.load(lightning)["state_dict"], plain)
    from_lightning = test_metrics(lightning)
    assert from_lightning == test_metrics(plain)
    assert from_lightning != volt_run.test_metrics()


def test_weights_that_do_not_fit_are_refused_naming_the_tensors(binary, volt_run, dataset, tmp_path):
    weights = volt_run.version_dir() / "checkpoints" / "last.ckpt"
    run = run_binary(binary, ["--model", "mlp", "--hidden", "64", "--no-train", "--weights", str(weights)] + SHORT,
                     tmp_path)
    assert run.returncode != 0
    assert "shape mismatch: 'net.1.weight' is [32, 784] in the checkpoint but [64, 784] in the module" in run.stderr, run
    assert "HINT:" in run.stderr


def test_no_train_without_weights_is_refused(binary, tmp_path):
    run = run_binary(binary, MLP + ["--no-train"], tmp_path)
    assert run.returncode != 0
    assert "--no-train tests a model as loaded" in run.stderr and "HINT: pass --weights" in run.stderr, run


@pytest.mark.compat
def test_torch_2_reads_a_volt_checkpoint_with_weights_only(volt_run, tmp_path):
    """PyPI's torch 2.x (the torchrun tests' install) refuses any global a plain torch.save lacks."""
    if not (TORCH2_PYTHONPATH / "torch").is_dir():
        pytest.fail(f"torch 2.x is not installed in {TORCH2_PYTHONPATH}: run scripts/setup.sh")
    last = volt_run.version_dir() / "checkpoints" / "last.ckpt"
    code = ("import sys, torch; c = torch.load(sys.argv[1], weights_only=True); "
            "print(torch.__version__, c['pytorch-lightning_version'], c['global_step'], sorted(c['loops']))")
    run = subprocess.run(["/usr/bin/python3", "-c", code, str(last)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(TORCH2_PYTHONPATH)))
    assert run.returncode == 0, run.stderr[-4000:]
    version, layout, step, loops = run.stdout.split(" ", 3)
    assert version.startswith("2.") and layout == "1.9.5" and step == "20", run.stdout
    assert loops.strip() == "['fit_loop', 'predict_loop', 'test_loop', 'validate_loop']", run.stdout
