"""Notebooks 03 and 05 in JupyterLab, in a real browser: run them, click their widgets, watch them redraw.

JupyterLab (on 127.0.0.1, with a token it insists on, on copies of the notebooks: see the
``lab`` fixture) is driven the way a reader drives it: the Run menu, a click into a cell and
Ctrl+Enter, real clicks on the widgets' buttons. Notebook 03's mode explorer is checked as
in the Voila test (explorer.py); notebook 05's live experiment must plot at least two
trials, stop when told, and leave no Gunicorn server behind; JupyterLab itself must leave
no process behind when it stops.

Screenshots go to ``test-artifacts/ui/lab-*.png``.
"""

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from explorer import EXPLORER, REDRAW_TIMEOUT, SLOWDOWN, check, click, wait_for

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

LOAD_TIMEOUT = 90 * SLOWDOWN      # s: JupyterLab's page loads and the notebook's kernel is idle
RUN_TIMEOUT = 180 * SLOWDOWN      # s: every cell of notebook 03 ran (the ILP solves, the figures' stills)
TRIALS_TIMEOUT = 150 * SLOWDOWN   # s: two trials of the live experiment (a fresh server each) finished
STOP_TIMEOUT = 90 * SLOWDOWN      # s: the trial in flight finished and its server stopped

LIVE = ".tuna-live-experiment"    # the live experiment's view (a class the view adds for this test)
# Every trial marker of the live plot (legend excluded), and the status line of the view.
LIVE_POINTS = f"{LIVE} .js-plotly-plot .cartesianlayer .scatterlayer path.point"
LIVE_STATUS = f"{LIVE} > .widget-html"


def open_notebook(page, lab, name):
    """Open ``name`` in JupyterLab and wait until its kernel is idle."""
    page.goto(lab.open_url(name), wait_until="domcontentloaded", timeout=LOAD_TIMEOUT * 1000)
    page.locator(".jp-NotebookPanel .jp-Notebook").first.wait_for(state="visible", timeout=LOAD_TIMEOUT * 1000)
    wait_idle(page, LOAD_TIMEOUT)


def wait_idle(page, timeout):
    """Wait until the status bar says the notebook's kernel is connected and idle.

    (The toolbar's execution indicator says "idle" before the kernel has even connected, and
    cells run then are silently not run.)
    """
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle$")).wait_for(
        state="visible", timeout=timeout * 1000)


def menu(page, *path):
    """Click through the menu bar: ``menu(page, "Run", "Run All Cells")``."""
    page.locator(".lm-MenuBar-itemLabel", has_text=path[0]).first.click()
    for item in path[1:]:
        page.locator(".lm-Menu-itemLabel").get_by_text(item, exact=True).click()


def prompts(page):
    """The input prompts of the notebook's code cells: ``"[3]:"``, ``"[*]:"`` (running) or ``"[ ]:"``."""
    # A cell whose input is collapsed (an exercise's hidden solution, run by nbval in make test) shows no
    # prompt at all: only the cells with a prompt are read. "[ ]:" and "[*]:" still count as not run.
    shown = [p.strip() for p in page.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()]
    return [p for p in shown if p]


def ran(prompt):
    """Whether an input prompt shows an execution count (``"[3]:"``), not ``"[*]:"`` or ``"[ ]:"``."""
    return prompt.strip()[1:-2].strip().isdigit()


def wait_all_ran(page, timeout):
    """Wait until every code cell has run (a number in its prompt) and the kernel is idle; the prompts."""
    deadline = time.monotonic() + timeout
    while True:
        shown = prompts(page)
        if shown and all(ran(p) for p in shown):
            wait_idle(page, max(1, deadline - time.monotonic()))
            return shown
        assert time.monotonic() < deadline, f"not every cell ran within {timeout:.0f}s: prompts {shown}"
        time.sleep(0.5)


def errors_shown(page):
    """Tracebacks the notebook shows in its outputs."""
    return page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                        has_text="Traceback").all_inner_texts()


def run_cell(page, text):
    """Run the one code cell whose source contains ``text``: click into it, Ctrl+Enter; wait for its number."""
    cell = page.locator(".jp-CodeCell", has=page.locator(".jp-InputArea-editor", has_text=text))
    assert cell.count() == 1, f"{cell.count()} code cells contain {text!r}"
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    prompt = cell.locator(".jp-InputPrompt")
    deadline = time.monotonic() + RUN_TIMEOUT
    while not ran(prompt.inner_text()):
        assert time.monotonic() < deadline, f"the cell with {text!r} did not run: {prompt.inner_text()}"
        time.sleep(0.25)
    return cell


def stored_plotly_figures(name):
    """How many Plotly figures the notebook ``name`` stores: each is drawn by JupyterLab's plotly renderer."""
    import nbformat

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    return sum("application/vnd.plotly.v1+json" in out.get("data", {})
               for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", ()))


def gunicorns(lab):
    """Gunicorn processes under JupyterLab (the live experiment's servers, started by the kernel)."""
    return {pid: cmd for pid, cmd in lab.processes().items() if "gunicorn" in cmd}


def test_jupyterlab_answers_only_with_its_token(lab):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{lab.url}api/sessions", timeout=30)
    assert refused.value.code == 403
    with urllib.request.urlopen(f"{lab.url}api/sessions?token={lab.token}", timeout=30) as answer:
        assert answer.status == 200 and json.load(answer) == []
    assert lab.stop() == [], "processes outlived JupyterLab's shutdown"


def test_nb03_runs_in_jupyterlab_and_the_mode_toggle_redraws(lab, page, console, artifacts):
    open_notebook(page, lab, "03_scatter_vs_compact.ipynb")
    menu(page, "Run", "Run All Cells")
    wait_all_ran(page, RUN_TIMEOUT)
    assert not errors_shown(page)
    # The drawn mappings (scatter, compact) go to JupyterLab's plotly renderer, not its image renderer:
    # it shows the stored PNG and turns it into the interactive figure when the mouse comes over it.
    figures = page.locator(".jp-OutputArea-output.jp-RenderedPlotly")
    assert figures.count() == stored_plotly_figures("03_scatter_vs_compact.ipynb")
    assert page.locator(".jp-OutputArea-output.jp-RenderedImage").count() == 0
    figures.first.scroll_into_view_if_needed()
    box = figures.first.locator("img.plot-img").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)     # the PNG gives way
    figures.first.locator(".plot-container .main-svg").first.wait_for(state="visible", timeout=REDRAW_TIMEOUT * 1000)

    explorer = page.locator(EXPLORER)
    explorer.wait_for(state="visible", timeout=REDRAW_TIMEOUT * 1000)
    explorer.scroll_into_view_if_needed()
    scatter = wait_for(explorer, "scatter", REDRAW_TIMEOUT, console)
    explorer.screenshot(path=artifacts / "lab-03-scatter.png")
    scatter_terms = check(scatter, "scatter", console)

    # A real click on "compact": the kernel re-solves and the figure is redrawn.
    click(page, explorer, "compact")
    compact = wait_for(explorer, "compact", REDRAW_TIMEOUT, console)
    explorer.screenshot(path=artifacts / "lab-03-compact.png")
    compact_terms = check(compact, "compact", console)
    assert compact["points"] != scatter["points"]
    assert compact_terms["f_main"] == scatter_terms["f_main"]
    assert compact_terms["objective"] != scatter_terms["objective"]

    errors = [line for line in console if " pageerror: " in line]
    assert not errors, f"uncaught errors in the page: {errors}"
    assert lab.stop() == [], "processes outlived JupyterLab's shutdown"


def test_nb05_live_experiment_in_jupyterlab_plots_trials_and_stops(lab, page, console, artifacts):
    open_notebook(page, lab, "05_live_pin_and_measure.ipynb")
    # The notebook's first cell (imports, sizes) and its live experiment; not the minute-long run between.
    run_cell(page, "setup()")
    run_cell(page, "live_experiment(")
    live = page.locator(LIVE)
    live.wait_for(state="visible", timeout=REDRAW_TIMEOUT * 1000)
    live.scroll_into_view_if_needed()
    status = page.locator(LIVE_STATUS)
    assert "idle:" in status.inner_text()
    assert page.locator(LIVE_POINTS).count() == 0
    assert not gunicorns(lab), "a server runs before start was clicked"

    page.evaluate("console.info('tuna-test: click start')")
    live.get_by_role("button", name="start").click()
    deadline, servers_seen = time.monotonic() + TRIALS_TIMEOUT, {}
    while page.locator(LIVE_POINTS).count() < 2:
        servers_seen.update(gunicorns(lab))
        assert time.monotonic() < deadline, \
            f"fewer than 2 trials plotted after {TRIALS_TIMEOUT:.0f}s: {status.inner_text()}"
        assert "failed" not in status.inner_text(), status.inner_text()
        time.sleep(0.5)
    live.screenshot(path=artifacts / "lab-05-live-running.png")
    assert "running:" in status.inner_text()
    assert servers_seen, "no Gunicorn server was seen under JupyterLab while trials ran"

    page.evaluate("console.info('tuna-test: click stop')")
    live.get_by_role("button", name="stop").click()
    deadline = time.monotonic() + STOP_TIMEOUT
    while not status.inner_text().startswith(("stopped:", "finished:")):
        assert time.monotonic() < deadline, f"the run did not stop within {STOP_TIMEOUT:.0f}s: {status.inner_text()}"
        time.sleep(0.5)
    points = page.locator(LIVE_POINTS).count()
    live.screenshot(path=artifacts / "lab-05-live-stopped.png")
    assert points >= 2 and live.get_by_role("button", name="start").is_enabled()
    assert not gunicorns(lab), f"servers left after stop: {gunicorns(lab)}"
    assert not errors_shown(page)

    errors = [line for line in console if " pageerror: " in line]
    assert not errors, f"uncaught errors in the page: {errors}"
    assert lab.stop() == [], "processes outlived JupyterLab's shutdown"
