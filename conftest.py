"""Root conftest: the Hypothesis profiles (dev, ci, thorough, selftest; see properties/profiles.py).

The profile is chosen by ``--hypothesis-profile=NAME`` (Hypothesis's own pytest option, applied
after this file is loaded, so it wins), else by the environment variable HYPOTHESIS_PROFILE,
else ``ci`` when the environment variable CI is set, else ``dev``.
"""

import pytest
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

