"""Fixtures shared by the tests.

The independent numpy reference of the model lives in ``reference.py``, the
hypothesis strategies in ``strategies.py`` and the helpers every file shares
(the CLI runners, server process groups, the user's model) in ``helpers.py``;
tests import them by name (``tests/`` is on ``sys.path`` as pytest's
rootdir-relative test directory).
"""

import fcntl
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from helpers import train_user_model
from tuna_lab import Topology


@pytest.fixture(scope="session")
def xeon():
    return Topology.preset("xeon-8272cl")


@pytest.fixture(scope="session")
def user_model(tmp_path_factory):
    """tests/userapp's model file (XGBoost, nthread=2), trained once for the whole session on made-up data."""
    return train_user_model(tmp_path_factory.mktemp("usermodel") / "model.json")


@pytest.fixture(scope="session")
def model_env(user_model):
    """The environment tests/userapp's apps run in: their model file (``USERAPP_MODEL``), no inherited pinning."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNA_LAB_", "OMP_", "GOMP_"))}
    if "TUNA_LAB_LOCK_DIR" in os.environ:       # an xdist worker's own CPU locks (conftest.py at the root)
        env["TUNA_LAB_LOCK_DIR"] = os.environ["TUNA_LAB_LOCK_DIR"]
    env.update(USERAPP_MODEL=str(user_model), PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="session")
def body(tmp_path_factory):
    """One request body for tests/userapp's apps."""
    path = tmp_path_factory.mktemp("body") / "request.json"
    path.write_text('{"rows": [[0.5, 0.25]]}')
    return path


#: Real machines from hwloc's test suite (sysfs/procfs dumps), as tar.bz2 archives.
HWLOC_DUMPS = Path(__file__).parent / "data" / "hwloc-dumps"


@pytest.fixture(scope="session")
def hwloc_dump_roots(tmp_path_factory):
    """``{archive name: its extracted filesystem root}``, each archive extracted once for the whole session.

    Under pytest-xdist the workers share one extraction (in the run's own temporary folder, which holds
    each worker's). Each archive has its own lock: a worker extracts those no other is extracting, then waits
    for the rest, so that two workers extract the dumps in about half the time one would.
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = shared / "hwloc-dumps"
    folder.mkdir(exist_ok=True)
    for flags in (fcntl.LOCK_EX | fcntl.LOCK_NB, fcntl.LOCK_EX):
        for archive in sorted(HWLOC_DUMPS.glob("*.tar.bz2")):
            name = archive.name.removesuffix(".tar.bz2")
            with open(folder / f".{name}.lock", "a") as lock:
                try:
                    fcntl.flock(lock, flags)
                except BlockingIOError:
                    continue                              # the other worker's: wait for it in the second pass
                if not (folder / f".{name}.done").exists():
                    shutil.rmtree(folder / name, ignore_errors=True)
                    _extract(archive, folder / name)
                    (folder / f".{name}.done").touch()
    roots = {}
    for archive in sorted(HWLOC_DUMPS.glob("*.tar.bz2")):
        dest = folder / archive.name.removesuffix(".tar.bz2")
        tops = [p.name for p in dest.iterdir()]
        assert len(tops) == 1, f"{archive.name}: expected one top-level directory"
        roots[dest.name] = dest / tops[0]
    return roots


def _extract(archive, dest):
    dest.mkdir()
    if shutil.which("tar"):
        # GNU tar extracts the 80,000 small files in a tenth of tarfile's time (these are the
        # project's own test data: hwloc's dumps, plain files and links).
        subprocess.run(["tar", "--no-same-owner", "-xjf", str(archive), "-C", str(dest)], check=True)
    else:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
