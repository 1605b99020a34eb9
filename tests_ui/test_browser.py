"""Notebook 03 in a real browser: Voila renders it, a click on the mode toggle re-solves and redraws.

The test reads the mode off the plot's SVG, and the objective terms off the status line, of
the notebook's mode explorer (see explorer.py), before and after real clicks on the toggle.

Screenshots of the explorer in each state go to ``test-artifacts/ui/``.
"""

from explorer import EXPLORER, REDRAW_TIMEOUT, SLOWDOWN, check, click, wait_for

RENDER_TIMEOUT = 150 * SLOWDOWN   # s: Voila runs the whole notebook (the ILP solves) before the page shows it


def test_mode_toggle_re_solves_and_redraws_in_voila(voila_url, page, console, artifacts):
    page.goto(voila_url, wait_until="commit", timeout=60_000)
    explorer = page.locator(EXPLORER)
    explorer.wait_for(state="visible", timeout=RENDER_TIMEOUT * 1000)
    explorer.scroll_into_view_if_needed()

    # As the notebook left it: scatter, drawn in full (an empty FigureWidget fails here).
    scatter = wait_for(explorer, "scatter", REDRAW_TIMEOUT, console)
    page.screenshot(path=artifacts / "0-page.png", full_page=True)
    explorer.screenshot(path=artifacts / "1-scatter.png")
    scatter_terms = check(scatter, "scatter", console)

    # A real click on "compact": the kernel re-solves, the status and the grid are redrawn.
    click(page, explorer, "compact")
    compact = wait_for(explorer, "compact", REDRAW_TIMEOUT, console)
    explorer.screenshot(path=artifacts / "2-compact.png")
    compact_terms = check(compact, "compact", console)
    assert compact["points"] != scatter["points"]
    # The main threads stay one per physical core in both modes: f_main does not move.
    assert compact_terms["f_main"] == scatter_terms["f_main"]
    assert compact_terms["objective"] != scatter_terms["objective"]

    # And back: the same mapping as before, drawn the same way.
    click(page, explorer, "scatter")
    back = wait_for(explorer, "scatter", REDRAW_TIMEOUT, console)
    explorer.screenshot(path=artifacts / "3-scatter-again.png")
    assert check(back, "scatter", console) == scatter_terms
    assert sorted(back["points"]) == sorted(scatter["points"])

    errors = [line for line in console if " pageerror: " in line]
    assert not errors, f"uncaught errors in the page: {errors}"
