import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_cache_dir(tmp_path_factory):
    """Keep the tests (and the processes they start) out of the user's measurement cache."""
    previous = os.environ.get("LOOPRL_CACHE_DIR")
    os.environ["LOOPRL_CACHE_DIR"] = str(tmp_path_factory.mktemp("looprl-cache"))
    yield
    if previous is None:
        os.environ.pop("LOOPRL_CACHE_DIR", None)
    else:
        os.environ["LOOPRL_CACHE_DIR"] = previous


@pytest.fixture(autouse=True, scope="session")
def strict_evaluation():
    """Evaluators re-raise compile and run failures in the tests (and in the processes they
    start): a failure must never pass for a slow schedule. Tests of the failure path turn it
    off for themselves."""
    previous = os.environ.get("LOOPRL_STRICT")
    os.environ["LOOPRL_STRICT"] = "1"
    yield
    if previous is None:
        os.environ.pop("LOOPRL_STRICT", None)
    else:
        os.environ["LOOPRL_STRICT"] = previous


@pytest.fixture
def cache_path(tmp_path):
    return os.path.join(tmp_path, "measurements.sqlite")
