"""Root conftest: the Hypothesis profiles (dev, ci, thorough, selftest, calibration; see
properties/profiles.py), and one intra-op thread per pytest-xdist worker.

The profile is chosen by ``--hypothesis-profile=NAME`` (Hypothesis's own pytest option, applied
after this file is loaded, so it wins), else by the environment variable HYPOTHESIS_PROFILE,
else ``ci`` when the environment variable CI is set, else ``dev``.
"""

import os

import pytest
import torch
from hypothesis import settings
from hypothesis.errors import InvalidArgument

from properties.profiles import default_profile, register_profiles

# options of the served-engine kit (--baseline, --served-*): properties/plugin/served.py
pytest_plugins = ["properties.plugin.served"]

register_profiles()
try:
    settings.load_profile(default_profile())
except InvalidArgument as exc:
    raise pytest.UsageError(f"HYPOTHESIS_PROFILE: {exc}") from exc



def pytest_configure(config):
    """A pytest-xdist worker shares the cores with the other workers: one intra-op thread each
    (and for the processes its tests start, OMP_NUM_THREADS). Two workers of two threads each on
    two cores spin-wait on each other: a test of many tiny float64 forwards ran 50 times slower
    so (118 s against 2.5 s for 50 requests to the deviating fake server, 2026-12-07)."""
    if getattr(config, "workerinput", None) is not None:
        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
