"""The notebooks' files: what nbval needs to compare them, and what keeps them small and listed.

`make test` runs the notebooks themselves with nbval (`pytest --nbval notebooks/`); these checks
are the cheap ones that make such a run meaningful: stored outputs to compare against, no
stored errors, figures tagged so that their version-dependent JSON is not compared, and files
that stay small enough to review.
"""

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
IGNORE = "nbval-ignore-output"
# Outputs whose content nbval cannot compare meaningfully across runs or library versions.
VOLATILE_MIME = ("application/vnd.plotly.v1+json",)
MAX_BYTES = 1_000_000      # plotly.js inlined in a figure output is ~4 MB


def _load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def _code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def test_there_are_notebooks():
    assert PATHS, f"no notebooks in {NOTEBOOKS}"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_notebook_is_executed_and_clean(path):
    nb = _load(path)
    assert nb["nbformat"] == 4
    assert nb["metadata"].get("kernelspec", {}).get("language") == "python"
    for cell in _code_cells(nb):
        tags = cell["metadata"].get("tags", [])
        head = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        head = head.strip().splitlines()[0] if head.strip() else ""
        if "nbval-skip" in tags or not head:
            continue
        assert cell["execution_count"] is not None, f"{path.name}: cell never run, no reference output: {head}"
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        assert not errors, f"{path.name}: stored error in cell {head!r}: {errors[0].get('ename')}"
        volatile = [m for o in cell["outputs"] for m in o.get("data", {}) if m in VOLATILE_MIME]
        assert not volatile or IGNORE in tags, \
            f"{path.name}: cell {head!r} shows a figure but is not tagged {IGNORE}"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_notebook_is_small(path):
    assert path.stat().st_size < MAX_BYTES, f"{path.name} is {path.stat().st_size} bytes: plotly.js inlined?"


def test_every_notebook_is_listed_in_the_readme():
    readme = (NOTEBOOKS / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in PATHS if p.name not in readme]
    assert not missing, f"notebooks/README.md does not list {missing}"
