"""Notebook 03 in a real browser: Voila renders it, a click on the mode toggle re-solves and redraws.

The mode explorer of ``notebooks/03_scatter_vs_compact.ipynb`` shows the
article's machine (``xeon-8272cl``: 16 physical cores x 2 SMT siblings) with
W = 4 workers x T = 8 threads, one thread per logical core. What the page
draws tells the modes apart: in scatter the two siblings of every physical
core hold threads of *different* workers (two marker colours per column of
the grid), in compact every physical core belongs to one worker (one colour
per column). The test reads that off the plot's SVG, and the objective terms
off the status line, before and after real clicks on the toggle.

Screenshots of the explorer in each state go to ``test-artifacts/ui/``.
"""

import os
import re
import time
from collections import defaultdict

# TUNA_UI_CPU_THROTTLE=N (see conftest.py) slows the page down N times: the waits grow with it.
SLOWDOWN = max(1.0, float(os.environ.get("TUNA_UI_CPU_THROTTLE", "1")) / 5)
RENDER_TIMEOUT = 150 * SLOWDOWN   # s: Voila runs the whole notebook (the ILP solves) before the page shows it
REDRAW_TIMEOUT = 60 * SLOWDOWN    # s: one click -> the kernel re-solves -> the figure is redrawn
WORKERS, THREADS, PHYSICAL = 4, 8, 16

# The explorer's own VBox: the one whose child is the mode toggle (tuna-mode-toggle, added by the view).
EXPLORER = ".widget-vbox:has(> .tuna-mode-toggle)"

# What the explorer shows: active toggle button, status text, plot title, and every thread marker
# of the plot area (legend excluded) as [x, y, fill] in pixels.
READ_STATE = """
(root) => {
  const status = Array.from(root.children).filter(c => c.classList.contains('widget-html'))
                      .map(c => c.innerText).join('\\n');
  const active = root.querySelector('.tuna-mode-toggle .mod-active');
  const plot = root.querySelector('.js-plotly-plot');
  const title = plot && plot.querySelector('.gtitle');
  const points = [];
  if (plot) {
    for (const p of plot.querySelectorAll('.cartesianlayer .scatterlayer path.point')) {
      const m = /translate\\(\\s*([-\\d.e]+)[ ,]+([-\\d.e]+)\\s*\\)/.exec(p.getAttribute('transform') || '');
      if (m) points.push([Math.round(+m[1]), Math.round(+m[2]), getComputedStyle(p).fill]);
    }
  }
  return {active: active ? active.innerText.trim() : null, status,
          title: title ? title.textContent : null, points};
}
"""


def _terms(status):
    """``{"f_main": .., "f_mode": .., "objective": ..}`` from the status line, {} if none shown yet."""
    return {k: int(v) for k, v in re.findall(r"\b(f_main|f_mode|objective)=(-?\d+)", status)}


def _colours_per_core(points):
    """Marker colours in each column of the grid (a column is one physical core, its SMT siblings stacked)."""
    columns = defaultdict(set)
    for x, _y, fill in points:
        columns[x].add(fill)
    return [len(c) for _x, c in sorted(columns.items())]


def _shows(state, mode):
    """Whether the page shows a complete drawing of ``mode``: the toggle, the status, the title, the markers."""
    return (state["active"] == mode and f"{mode}: f_main=" in state["status"]
            and (state["title"] or "").endswith(f", {mode}") and len(state["points"]) == WORKERS * THREADS)


def _anywidget_gave_up(console):
    # anywidget >= 0.9.17 gives a model 2 s to load its ESM (plotly's is ~5 MB); past that it drops every
    # later message to the model: the figure keeps its first drawing whatever the kernel sends.
    return any("[anywidget] Failed to initialize model" in line for line in console)


def _wait_for(explorer, mode, timeout, console):
    """Poll the explorer until it shows ``mode`` (or ``timeout`` passes, or it never can); the last state read."""
    deadline = time.monotonic() + timeout
    while True:
        state = explorer.evaluate(READ_STATE)
        if _shows(state, mode) or time.monotonic() > deadline or _anywidget_gave_up(console):
            return state
        time.sleep(0.25)


def _click(page, explorer, mode):
    """A real mouse click on the toggle's ``mode`` button (marked in the console log, to read the logs by)."""
    page.evaluate(f"console.info('tuna-test: click {mode}')")
    explorer.locator(".tuna-mode-toggle").get_by_role("button", name=mode, exact=True).click()


def _check(state, mode, console):
    """Assert that ``state`` is a full drawing of ``mode`` (see the module's docstring); its objective terms."""
    if not _shows(state, mode):
        errors = [line for line in console if " pageerror: " in line]
        hint = ("; anywidget gave up initialising plotly's FigureWidget model (its 2 s limit, passed on a slow "
                "or busy machine), so the figure cannot be redrawn" if _anywidget_gave_up(console) else "")
        raise AssertionError(f"the explorer did not show {mode} in time{hint}: {state}; page errors: {errors}")
    colours = {fill for _x, _y, fill in state["points"]}
    assert len(colours) == WORKERS, f"one marker colour per worker expected, got {sorted(colours)}"
    per_core = _colours_per_core(state["points"])
    assert len(per_core) == PHYSICAL, f"{PHYSICAL} columns of physical cores expected, got {len(per_core)}"
    terms = _terms(state["status"])
    if mode == "scatter":       # siblings of every physical core hold two different workers; f_mode > 0
        assert per_core == [2] * PHYSICAL, f"scatter: workers per physical core {per_core}"
        assert terms["f_mode"] > 0, state["status"]
    else:                       # every physical core held by one worker; f_mode < 0
        assert per_core == [1] * PHYSICAL, f"compact: workers per physical core {per_core}"
        assert terms["f_mode"] < 0, state["status"]
    return terms


def test_mode_toggle_re_solves_and_redraws_in_voila(voila_url, page, console, artifacts):
    page.goto(voila_url, wait_until="commit", timeout=60_000)
    explorer = page.locator(EXPLORER)
    explorer.wait_for(state="visible", timeout=RENDER_TIMEOUT * 1000)
    explorer.scroll_into_view_if_needed()

    # As the notebook left it: scatter, drawn in full (an empty FigureWidget fails here).
    scatter = _wait_for(explorer, "scatter", REDRAW_TIMEOUT, console)
    page.screenshot(path=artifacts / "0-page.png", full_page=True)
    explorer.screenshot(path=artifacts / "1-scatter.png")
    scatter_terms = _check(scatter, "scatter", console)

    # A real click on "compact": the kernel re-solves, the status and the grid are redrawn.
    _click(page, explorer, "compact")
    compact = _wait_for(explorer, "compact", REDRAW_TIMEOUT, console)
    explorer.screenshot(path=artifacts / "2-compact.png")
    compact_terms = _check(compact, "compact", console)
    assert compact["points"] != scatter["points"]
    # The main threads stay one per physical core in both modes: f_main does not move.
    assert compact_terms["f_main"] == scatter_terms["f_main"]
    assert compact_terms["objective"] != scatter_terms["objective"]

    # And back: the same mapping as before, drawn the same way.
    _click(page, explorer, "scatter")
    back = _wait_for(explorer, "scatter", REDRAW_TIMEOUT, console)
    explorer.screenshot(path=artifacts / "3-scatter-again.png")
    assert _check(back, "scatter", console) == scatter_terms
    assert sorted(back["points"]) == sorted(scatter["points"])

    errors = [line for line in console if " pageerror: " in line]
    assert not errors, f"uncaught errors in the page: {errors}"
