"""Fixtures shared by the tests.

The independent numpy reference of the model lives in ``reference.py`` and
the hypothesis strategies in ``strategies.py``; tests import them by name
(``tests/`` is on ``sys.path`` as pytest's rootdir-relative test directory).
"""

import pytest

from tuna_lab import Topology


@pytest.fixture(scope="session")
def xeon():
    return Topology.preset("xeon-8272cl")
