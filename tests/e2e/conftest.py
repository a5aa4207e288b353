"""Fixtures for the end-to-end tests of examples/fashion_mnist (helpers: volt_e2e.py, and tests/volt_testkit.py,
shared with the other folders)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from volt_e2e import DATA_DIR, DETERMINISTIC, SHORT, assert_ok, example_binary, run_binary  # noqa: E402
from volt_testkit import require  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: full-length training runs (the accuracy targets)")
    config.addinivalue_line("markers", "long: runs of minutes against a documented figure, left out of CI")


@pytest.fixture(scope="session")
def binary():
    return example_binary("VOLT_EXAMPLE", "fashion_mnist")


@pytest.fixture(scope="session")
def dataset():
    require((DATA_DIR / "t10k-images-idx3-ubyte.gz").exists(),
            f"Fashion-MNIST is not installed in {DATA_DIR} (apt-get install dataset-fashion-mnist)")
    return DATA_DIR




# The 2-epoch MLP run that test_run.py reads (what a run prints and writes) and test_resume.py
# compares a resumed run with: made once for both.
MLP_TWO_EPOCHS = ["--model", "mlp", "--max-epochs", "2", "--log-every-n-steps", "5"] + SHORT + DETERMINISTIC


@pytest.fixture(scope="session")
def mlp_two_epochs(binary, dataset, tmp_path_factory):
    """`MLP_TWO_EPOCHS` on 20 batches per epoch; test_run.py runs a second run in its root later
    (version_1: version_0 stays this run's)."""
    run = run_binary(binary, MLP_TWO_EPOCHS, tmp_path_factory.mktemp("run"))
    assert_ok(run)
    return run
