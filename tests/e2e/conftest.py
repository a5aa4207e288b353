"""Fixtures for the end-to-end tests of examples/fashion_mnist (helpers: volt_e2e.py)."""
import os

import pytest

from volt_e2e import DATA_DIR


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: full-length training runs (the accuracy targets)")


@pytest.fixture(scope="session")
def binary():
    path = os.environ.get("VOLT_EXAMPLE")
    if not path:
        pytest.fail("VOLT_EXAMPLE is not set; run through CTest, or export "
                    "VOLT_EXAMPLE=/path/to/build/examples/fashion_mnist")
    if not os.access(path, os.X_OK):
        pytest.fail(f"VOLT_EXAMPLE={path} is not an executable file")
    return path


@pytest.fixture(scope="session")
def dataset():
    if not (DATA_DIR / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip(f"Fashion-MNIST is not installed in {DATA_DIR} (apt-get install dataset-fashion-mnist)")
    return DATA_DIR


