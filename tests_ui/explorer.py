"""The mode explorer of notebook 03 as a page shows it: read its state, click its toggle, check a drawing.

Shared by the Voila test (test_browser.py) and the JupyterLab test (test_lab.py): both render
the same ipywidgets view, so the same DOM. The explorer shows the article's machine
(``xeon-8272cl``: 16 physical cores x 2 SMT siblings) with W = 4 workers x T = 8 threads, one
thread per logical core. What the page draws tells the modes apart: in scatter the two siblings
of every physical core hold threads of *different* workers (two marker colours per column of
the grid), in compact every physical core belongs to one worker (one colour per column).
"""

import os
import re
import time
from collections import defaultdict

# TUNA_UI_CPU_THROTTLE=N (see conftest.py) slows the page down N times: the waits grow with it.
SLOWDOWN = max(1.0, float(os.environ.get("TUNA_UI_CPU_THROTTLE", "1")) / 5)
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
      // The rings round the threads the toggle moved are hollow markers (fill none): not threads.
      const fill = getComputedStyle(p).fill;
      if (m && fill !== 'none') points.push([Math.round(+m[1]), Math.round(+m[2]), fill]);
    }
  }
  return {active: active ? active.innerText.trim() : null, status,
          title: title ? title.textContent : null, points};
}
"""


def terms(status):
    """``{"f_main": .., "f_mode": .., "objective": ..}`` from the status line, {} if none shown yet."""
    return {k: int(v) for k, v in re.findall(r"\b(f_main|f_mode|objective)=(-?\d+)", status)}


def colours_per_core(points):
    """Marker colours in each column of the grid (a column is one physical core, its SMT siblings stacked)."""
    columns = defaultdict(set)
    for x, _y, fill in points:
        columns[x].add(fill)
    return [len(c) for _x, c in sorted(columns.items())]


def shows(state, mode):
    """Whether the page shows a complete drawing of ``mode``: the toggle, the status, the title, the markers."""
    return (state["active"] == mode and f"{mode}: f_main=" in state["status"]
            and (state["title"] or "").endswith(f", {mode}") and len(state["points"]) == WORKERS * THREADS)


def anywidget_gave_up(console):
    # anywidget >= 0.9.17 gives a model 2 s to load its ESM (plotly's is ~5 MB); past that it drops every
    # later message to the model: the figure keeps its first drawing whatever the kernel sends.
    return any("[anywidget] Failed to initialize model" in line for line in console)


def wait_for(explorer, mode, timeout, console):
    """Poll the explorer until it shows ``mode`` (or ``timeout`` passes, or it never can); the last state read."""
    deadline = time.monotonic() + timeout
    while True:
        state = explorer.evaluate(READ_STATE)
        if shows(state, mode) or time.monotonic() > deadline or anywidget_gave_up(console):
            return state
        time.sleep(0.25)


def click(page, explorer, mode):
    """A real mouse click on the toggle's ``mode`` button (marked in the console log, to read the logs by)."""
    page.evaluate(f"console.info('tuna-test: click {mode}')")
    explorer.locator(".tuna-mode-toggle").get_by_role("button", name=mode, exact=True).click()


def check(state, mode, console):
    """Assert that ``state`` is a full drawing of ``mode`` (see the module's docstring); its objective terms."""
    if not shows(state, mode):
        errors = [line for line in console if " pageerror: " in line]
        hint = ("; anywidget gave up initialising plotly's FigureWidget model (its 2 s limit, passed on a slow "
                "or busy machine), so the figure cannot be redrawn" if anywidget_gave_up(console) else "")
        raise AssertionError(f"the explorer did not show {mode} in time{hint}: {state}; page errors: {errors}")
    colours = {fill for _x, _y, fill in state["points"]}
    assert len(colours) == WORKERS, f"one marker colour per worker expected, got {sorted(colours)}"
    per_core = colours_per_core(state["points"])
    assert len(per_core) == PHYSICAL, f"{PHYSICAL} columns of physical cores expected, got {len(per_core)}"
    found = terms(state["status"])
    if mode == "scatter":       # siblings of every physical core hold two different workers; f_mode > 0
        assert per_core == [2] * PHYSICAL, f"scatter: workers per physical core {per_core}"
        assert found["f_mode"] > 0, state["status"]
    else:                       # every physical core held by one worker; f_mode < 0
        assert per_core == [1] * PHYSICAL, f"compact: workers per physical core {per_core}"
        assert found["f_mode"] < 0, state["status"]
    return found
