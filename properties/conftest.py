"""Loads the kit's pytest plugin (properties/plugin/kit.py) for the tests under properties/.

The plugin lives in a module of its own so that it can be read, imported and tested like any
other; a conftest is only where pytest looks for it. Its hooks are named here one by one:
as a directory conftest they act on the kit's tests only.
"""

from properties.plugin.kit import (  # noqa: F401
    _one_torch_thread,
    impl,
    pytest_addoption,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_report_header,
    pytest_runtest_call,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_unconfigure,
    pytest_xdist_node_collection_finished,
)
from properties.plugin.hooks import pytest_addhooks  # noqa: F401
