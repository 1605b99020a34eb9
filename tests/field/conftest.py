"""The field test (``make field``, docs/field.md): tuna-lab against serving frameworks installed from PyPI.

MLServer and LitServe each run from their own venv under ``.venv-field/`` (made
by ``make field``, never the project's ``.venv``), serve an XGBoost model the
test trains on made-up data, on 127.0.0.1 with 2 inference workers; tuna-lab
runs from ``.venv`` as a user runs it. What is asserted is read from ``/proc``
(tests/field/fieldkit.py). ``make test`` does not collect this folder
(``norecursedirs`` in pyproject.toml): it needs the field venvs.
"""

import os
import time

import psutil
import pytest
from fieldkit import CPUS, TUNA_LAB

#: Variables that would change how a framework's workers or tuna-lab run, left out of the servers' environment.
_NOT_PASSED = ("OMP_", "GOMP_", "TUNA_LAB_", "MLSERVER_", "PYTHON", "VIRTUAL_ENV")


def pytest_collection_modifyitems(items):
    """Two CPUs at least (W=2 x T=2 placed apart), and the project's tuna-lab."""
    reason = None
    if len(CPUS) < 2:
        reason = f"the field test places 2 workers x 2 threads: needs 2 CPUs, this process has {len(CPUS)}"
    elif not TUNA_LAB.exists():
        reason = f"no {TUNA_LAB}: `make field` installs the project first"
    if reason:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def server_env():
    """The environment a framework's server starts in: this one without OpenMP, tuna_lab or Python settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_NOT_PASSED)}


@pytest.fixture(autouse=True, scope="module")
def _no_process_left_behind():
    """Every server a module starts is gone when it ends (its fixture stops the whole process group)."""
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    yield
    deadline = time.monotonic() + 10
    while True:
        left = [c.pid for c in psutil.Process().children(recursive=True)
                if c.pid not in before and c.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes left running: {left}"
