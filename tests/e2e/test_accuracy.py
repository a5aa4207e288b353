"""The accuracy targets of the main job: 3 full epochs on all of Fashion-MNIST (slow: minutes)."""
import sys

import pytest

from volt_e2e import assert_ok, run_binary

TARGETS = [("mlp", 0.87, 900), ("cnn", 0.90, 1500)]


@pytest.mark.slow
@pytest.mark.parametrize("model,target,timeout", TARGETS, ids=[t[0] for t in TARGETS])
def test_reaches_target_accuracy(binary, dataset, tmp_path, model, target, timeout):
    run = run_binary(binary, ["--model", model, "--max-epochs", "3", "--seed", "1", "--no-progress-bar"], tmp_path,
                     timeout=timeout)
    assert_ok(run)
    fields, metrics = run.summary()
    assert fields["epochs completed"] == "3"
    accuracy = float(run.test_metrics()["test/acc"])
    # Shown with -rA / -s, and in CTest's log on failure.
    print(f"\n{model}: test/acc={accuracy:.4f} val/acc={metrics['val/acc']} in {run.seconds:.0f} s wall "
          f"(fit {fields['time']})", file=sys.stderr)
    assert accuracy >= target, f"{model} reached test/acc={accuracy} < {target} in {run.seconds:.0f} s"
