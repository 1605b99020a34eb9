"""docs/anatomy.md's example line is what its stored run gives (issue 46: no figure from nothing)."""

import re
from pathlib import Path

from tuna_lab.analysis.anatomy import anatomy_note
from tuna_lab.measure.store import load_results

ROOT = Path(__file__).parent.parent


def test_the_documented_anatomy_line_is_the_stored_runs_own():
    # The line `report --json` prints as "anatomy" (summary.summarize's anatomy_note), without drawing a report.
    doc = (ROOT / "docs" / "anatomy.md").read_text()
    assert "tuna-lab report notebooks/data/anatomy-2cpu --json" in doc
    requests, trials, _ = load_results(str(ROOT / "notebooks" / "data" / "anatomy-2cpu"))
    assert re.findall(r"^Anatomy of the slowest 1%.*$", doc, re.M) == [anatomy_note(requests, trials)]
