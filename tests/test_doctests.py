"""Every docstring example of tuna_lab runs, as networkx runs its own with ``--doctest-modules``.

An example that needs a live server, a cluster or the network is marked
``# doctest: +SKIP`` with the reason beside it. The modules collected are
those under :data:`PACKAGES`, or under the comma-separated list in the
``TUNA_LAB_DOCTESTS`` environment variable (``TUNA_LAB_DOCTESTS=tuna_lab``
runs every module of the package), less :data:`EXCLUDED`.
"""

import doctest
import importlib
import os
import pkgutil
import warnings
from pathlib import Path

import pytest

import tuna_lab

ROOT = Path(__file__).resolve().parent.parent

#: The packages whose modules' examples run by default: all of tuna_lab.
PACKAGES = ("tuna_lab",)
MODULES_ALONE = ()
#: Modules left out of the default run (none: every example runs or says why it is skipped).
EXCLUDED = ()

#: Never collected: Gunicorn's config module reads the launcher's placement (TUNA_LAB_STATE) when it is
#: imported, as the server's master does; it has no examples.
NOT_IMPORTABLE_HERE = ("tuna_lab.server.gunicorn_conf",)

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _walk(package):
    """``package`` and every module under it."""
    module = importlib.import_module(package)
    names = [package]
    if hasattr(module, "__path__"):
        names.extend(m.name for m in pkgutil.walk_packages(module.__path__, package + "."))
    return names


def _selected():
    """The names of the modules whose examples run."""
    wanted = [w.strip() for w in os.environ.get("TUNA_LAB_DOCTESTS", "").split(",") if w.strip()]
    if wanted:
        names = {n for package in wanted for n in _walk(package)}
    else:
        names = ({n for package in PACKAGES for n in _walk(package)} | set(MODULES_ALONE)) - set(EXCLUDED)
    # A __main__ module runs its command when imported.
    return sorted(n for n in names - set(NOT_IMPORTABLE_HERE) if not n.endswith(".__main__"))


MODULES = _selected()


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name, monkeypatch):
    # Examples read files by paths relative to the repository (notebooks/data/...).
    monkeypatch.chdir(ROOT)
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = [t for t in finder.find(module, name, module=module) if t.examples]
    if not tests:
        pytest.skip("no examples")
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    failures = []
    with warnings.catch_warnings():
        # An example shows a function's result; a warning it gives on this machine (a missing cache
        # level in a container's sysfs, say) is not part of it.
        warnings.simplefilter("ignore")
        for test in tests:
            out = []
            result = runner.run(test, out=out.append, clear_globs=True)
            if result.failed:
                failures.append("".join(out))
    assert not failures, "\n".join(failures)[:20000]


def test_a_failing_example_fails():
    # The runner itself: a wrong expected output is reported, a +SKIP one is not run.
    def example():
        """
        >>> 1 + 1
        3
        >>> raise SystemExit  # doctest: +SKIP
        """

    test = doctest.DocTestFinder().find(example, "example", globs={})[0]
    out = []
    result = doctest.DocTestRunner(optionflags=FLAGS).run(test, out=out.append)
    assert (result.failed, result.attempted) == (1, 1) and "Expected:\n    3" in "".join(out)
    assert tuna_lab.__name__ == "tuna_lab"
