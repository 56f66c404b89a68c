import os

import pytest


@pytest.fixture
def cache_path(tmp_path):
    return os.path.join(tmp_path, "measurements.sqlite")
