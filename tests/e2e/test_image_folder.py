"""The example trained from PNG files: scripts/export-fashion-mnist-images.py writes Fashion-MNIST
in torchvision's ImageFolder layout, and `--data-dir` on that folder decodes it per batch."""
import subprocess
from pathlib import Path

import pytest

from volt_e2e import DETERMINISTIC, SHORT, assert_ok, run_binary

EXPORT = Path(__file__).resolve().parents[2] / "scripts" / "export-fashion-mnist-images.py"


@pytest.fixture(scope="module")
def small_folder(dataset, tmp_path_factory):
    """The first 1500 training and test images as PNG files."""
    out = tmp_path_factory.mktemp("png")
    export = subprocess.run([str(EXPORT), str(out), "--limit", "1500"], capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr
    assert len(list((out / "train").rglob("*.png"))) == 1500
    return out


ARGS = ["--model", "mlp", "--max-epochs", "1", "--val-size", "300"] + SHORT + DETERMINISTIC


def test_trains_from_an_image_folder_with_workers(binary, small_folder, tmp_path):
    runs = [run_binary(binary, ARGS + ["--data-dir", str(small_folder), "--num-workers", str(k)], tmp_path / str(k))
            for k in (0, 3)]
    for run in runs:
        assert_ok(run)
        assert float(run.test_metrics()["test/acc"]) > 0.3, run  # 10 classes: chance is 0.1
    assert runs[0].test_metrics() == runs[1].test_metrics(), "workers change when, not what"


def test_a_damaged_image_is_named_or_skipped_and_reported(binary, small_folder, tmp_path):
    damaged = sorted((small_folder / "test").rglob("*.png"))[0]
    original = damaged.read_bytes()
    try:
        damaged.write_bytes(original[:40])
        run = run_binary(binary, ARGS + ["--data-dir", str(small_folder)], tmp_path / "strict")
        assert run.returncode != 0
        assert f"cannot decode PNG '{damaged}'" in run.stderr, run
        assert "HINT:" in run.stderr
        # The test loader reads the folder in order: the first test batch holds the damaged file.
        run = run_binary(binary, ARGS + ["--data-dir", str(small_folder), "--skip-unreadable-images"],
                         tmp_path / "lenient")
        assert_ok(run)
        assert "skipped 1 unreadable image(s):" in run.stdout and str(damaged) in run.stdout, run
    finally:
        damaged.write_bytes(original)
