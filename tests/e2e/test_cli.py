"""--fast-dev-run, --print-plan and --help."""
import os
import re

from volt_e2e import assert_ok, run_binary


def test_fast_dev_run_runs_one_batch_per_stage_and_writes_nothing(binary, dataset, tmp_path):
    run = run_binary(binary, ["--model", "mlp", "--fast-dev-run", "1", "--num-threads", "1"], tmp_path)
    assert_ok(run)
    fields, _ = run.summary()
    assert fields["global step"] == "1"
    assert fields["stop reason"] == "max_steps"
    assert "log dir" not in fields and "last checkpoint" not in fields, fields
    # The plain (non-terminal) progress lines end every stage with done/total.
    assert re.search(r"^Epoch 0: 1/1 \(100%\)", run.stdout, re.M), run.stdout
    assert re.search(r"^Validation: 1/1 \(100%\)", run.stdout, re.M), run.stdout
    assert re.search(r"^Testing: 1/1 \(100%\)", run.stdout, re.M), run.stdout
    assert "Sanity Checking" not in run.stdout
    assert set(run.test_metrics()) == {"test/acc", "test/loss"}
    assert not (tmp_path / "lightning_logs").exists()
    written = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    assert written == [], f"--fast-dev-run wrote {written}"


def test_print_plan(binary, tmp_path):
    run = run_binary(binary, ["--print-plan", "--max-epochs", "4", "--limit-train-batches", "0.25", "--seed", "3",
                              "--num-threads", "1"], tmp_path, timeout=30)
    assert_ok(run)
    # "key" padded to 24 columns, then the value (a 23-character key leaves a single space).
    plan = {line[:24].strip(): line[24:].strip() for line in run.stdout.splitlines() if line}
    assert plan["accelerator"] == "cpu"
    assert plan["libtorch"].count(".") == 2, plan["libtorch"]  # e.g. 1.13.1
    assert plan["precision"] == "32-true"
    assert plan["max_epochs"] == "4"
    assert plan["limit_train_batches"] == "0.25"
    assert plan["seed"] == "3"
    assert plan["threads per process"] == "1"
    assert plan["root dir"] == str(tmp_path)
    assert "fast_dev_run" in plan
    assert not any(tmp_path.iterdir()), "--print-plan must not train or write"


def test_help(binary, tmp_path):
    run = run_binary(binary, ["--help"], tmp_path, timeout=30)
    assert_ok(run)
    for flag in ("--max-epochs", "--limit-train-batches", "--ckpt-path", "--model", "--fast-dev-run", "--seed",
                 "--default-root-dir", "--print-plan"):
        assert flag in run.stdout, f"{flag} missing from --help:\n{run.stdout}"
