# python/tests/conftest.py: the environment of the Python suite: two CPU devices, private caches, and helpers shared by the tests.
import os
import shutil
import tempfile

# Before kiln starts: a second CPU device, so that copies between devices and
# the mismatch error are tested on any machine (as the C suites do with
# KILN_CPU_DEVICES=2), and kernel caches that are not the user's.
os.environ.setdefault("KILN_CPU_DEVICES", "2")
_cache = tempfile.mkdtemp(prefix="kiln-pytest-cache-")
os.environ["KILN_CACHE_DIR"] = _cache
os.environ.setdefault("POCL_CACHE_DIR", os.path.join(_cache, "pocl"))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kiln  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_cache, ignore_errors=True)


@pytest.fixture(scope="session")
def cpu():
    return kiln.device("cpu:0")


@pytest.fixture(scope="session")
def cpu1():
    """The second CPU device (KILN_CPU_DEVICES=2)."""
    devices = [d for d in kiln.devices() if d.backend == "cpu"]
    if len(devices) < 2:
        pytest.skip("needs KILN_CPU_DEVICES=2")
    return devices[1]


@pytest.fixture(scope="session")
def all_devices():
    """Every visible device except simulators (Oclgrind is correct but slow)."""
    return [d for d in kiln.devices() if "oclgrind" not in d.name.lower()]


def host(t):
    """A tensor's values as a NumPy array (a copy)."""
    return np.asarray(t)
