"""The notebooks' files and their helper module: what nbval needs, and what a reader who runs nothing sees.

`make test` runs the notebooks themselves with nbval (`pytest --nbval notebooks/`); these checks
are the cheap ones that make such a run meaningful: stored outputs to compare against, no
stored errors, figures tagged so that their version-dependent JSON is not compared, and files
that stay small enough to review. And the ones a reader on GitHub or the docs site notices:
every stored figure has a still image, one title style, one setup call instead of a copied
block. The exercises a student works through: a question, an empty "your turn" cell, then a
collapsed solution whose answer is not stored under the question. Then :mod:`tuna_lab.notebook`
itself.
"""

import ast
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tuna_lab.errors import AnalysisError
from tuna_lab.notebook import log_interval, milliseconds

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
IGNORE = "nbval-ignore-output"
# Outputs whose content nbval cannot compare meaningfully across runs or library versions.
VOLATILE_MIME = ("application/vnd.plotly.v1+json",)
PLOTLY = "application/vnd.plotly.v1+json"
MAX_BYTES = 1_000_000      # plotly.js inlined in a figure output is ~4 MB
# What the issue asked each of these to show without running anything (GitHub, the docs).
# The exercise convention: "**N.**" opens an exercise in a markdown cell; the next cell is an
# empty code cell tagged YOUR_TURN, the one after it the solution, tagged SOLUTION and IGNORE,
# its source collapsed and its outputs not stored (notebooks/_build.py strips them).
EXERCISE = re.compile(r"^\*\*(\d+)\.\*\*", re.MULTILINE)
YOUR_TURN, SOLUTION = "your-turn", "solution"
MUST_SHOW = {"03_scatter_vs_compact.ipynb": 2,           # the scatter and the compact mapping
             "04_why_baselines_fall_short.ipynb": 1,     # the baselines' per-core loads
             "05_live_pin_and_measure.ipynb": 1}         # the live p99 per policy


def _load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def _code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _source(cell):
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def _outputs(nb):
    return [o for c in _code_cells(nb) for o in c["outputs"]]


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


def _tags(cell):
    return cell["metadata"].get("tags", [])


def _exercise_problems(cells):
    """What breaks the exercise convention in ``cells``, as messages (empty when it holds)."""
    problems, numbers = [], []
    for i, cell in enumerate(cells):
        text, tags = _source(cell), _tags(cell)
        head = text.strip().splitlines()[0][:60] if text.strip() else f"cell {i}"
        if cell["cell_type"] == "markdown":
            if re.search(r"<summary>\s*Solution", text, re.IGNORECASE):
                problems.append(f"{head!r}: a solution written out in the question's cell")
            found = EXERCISE.findall(text)
            if len(found) > 1:
                problems.append(f"{head!r}: exercises {found} in one cell, each needs its own cells")
            if found:
                numbers.append(int(found[0]))
                turn, solution = (cells[i + 1:i + 3] + [None, None])[:2]
                if not (turn and turn["cell_type"] == "code" and YOUR_TURN in _tags(turn)):
                    problems.append(f"exercise {found[0]}: not followed by a code cell tagged {YOUR_TURN!r}")
                if not (solution and SOLUTION in _tags(solution)):
                    problems.append(f"exercise {found[0]}: no cell tagged {SOLUTION!r} after the {YOUR_TURN!r} cell")
            continue
        if YOUR_TURN in tags:
            code = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
            if code or not text.strip():
                problems.append(f"{head!r}: a {YOUR_TURN!r} cell holds only a comment for the student")
            if cell["outputs"]:
                problems.append(f"{head!r}: a {YOUR_TURN!r} cell with stored outputs")
            if i == 0 or not EXERCISE.search(_source(cells[i - 1])) or cells[i - 1]["cell_type"] != "markdown":
                problems.append(f"{head!r}: a {YOUR_TURN!r} cell that does not follow an exercise")
        if SOLUTION in tags:
            if IGNORE not in tags:
                problems.append(f"{head!r}: a solution not tagged {IGNORE!r}")
            if cell["metadata"].get("jupyter", {}).get("source_hidden") is not True:
                problems.append(f"{head!r}: a solution whose source is not collapsed (jupyter.source_hidden)")
            if cell["outputs"]:
                problems.append(f"{head!r}: a solution with stored outputs: re-run notebooks/_build.py")
            if i == 0 or YOUR_TURN not in _tags(cells[i - 1]):
                problems.append(f"{head!r}: a solution without a {YOUR_TURN!r} cell before it")
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"exercises numbered {numbers}, not 1..{len(numbers)}")
    return problems


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_every_exercise_has_a_your_turn_cell_then_a_hidden_solution(path):
    problems = _exercise_problems(_load(path)["cells"])
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_the_exercise_check_finds_an_answer_shown_under_its_question():
    def code(source, tags=(), outputs=(), hidden=False):
        meta = {"tags": list(tags), **({"jupyter": {"source_hidden": True}} if hidden else {})}
        return {"cell_type": "code", "source": source, "metadata": meta, "outputs": list(outputs)}

    question = {"cell_type": "markdown", "source": "**1.** How far apart are cpus 0 and 1?", "metadata": {}}
    turn = code("# your turn: d(0, 1)", [YOUR_TURN])
    answer = code("print(D[0, 1])", [SOLUTION, IGNORE], hidden=True)
    assert _exercise_problems([question, turn, answer]) == []
    shown = {"output_type": "stream", "name": "stdout", "text": "10.0\n"}
    assert _exercise_problems([question, turn, {**answer, "outputs": [shown]}])        # the answer stored
    assert _exercise_problems([question, answer])                                     # no cell to try first
    assert _exercise_problems([question, turn, code("print(D[0, 1])", [SOLUTION, IGNORE])])   # not collapsed
    assert _exercise_problems([{**question, "source": question["source"] + "\n<details><summary>Solution"
                                "</summary>10</details>"}, turn, answer])


def test_build_runs_solutions_but_stores_none_of_their_outputs(tmp_path):
    import subprocess
    import sys

    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 6 * 7\nprint('shown', x)"),
        nbformat.v4.new_code_cell("print('the answer', x)", metadata={"tags": [SOLUTION, IGNORE]})])
    path = tmp_path / "99_check.ipynb"

    def build():
        return subprocess.run([sys.executable, str(NOTEBOOKS / "_build.py"), str(path)],
                              capture_output=True, text=True, timeout=300, check=False)

    nbformat.write(nb, path)
    out = build()
    assert out.returncode == 0, out.stderr
    shown, solution = nbformat.read(path, as_version=4).cells
    assert "shown 42" in shown.outputs[0]["text"] and solution.outputs == [] and solution.execution_count
    # A solution that fails stops the build, so stripping its output cannot hide a broken answer.
    nb.cells[1].source = "raise ValueError('broken answer')"
    nbformat.write(nb, path)
    out = build()
    assert out.returncode != 0 and "broken answer" in out.stderr


def test_every_notebook_is_listed_in_the_readme():
    readme = (NOTEBOOKS / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in PATHS if p.name not in readme]
    assert not missing, f"notebooks/README.md does not list {missing}"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_every_stored_figure_has_a_still_image(path):
    # GitHub, the docs site and nbconvert cannot run plotly.js: the PNG beside the JSON is what they show.
    outputs = _outputs(_load(path))
    figures = [o for o in outputs if PLOTLY in o.get("data", {})]
    bare = [o for o in figures if "image/png" not in o["data"]]
    assert not bare, (f"{path.name}: {len(bare)} of {len(figures)} figures stored without a still image: "
                      "re-run notebooks/_build.py where kaleido finds a Chrome/Chromium")
    # No HTML fallback either: those viewers would prefer it to the PNG and show an empty box.
    assert not [o for o in figures if "text/html" in o["data"]], f"{path.name}: figure stored with HTML"
    stills = sum("image/png" in o.get("data", {}) for o in outputs)
    assert stills >= MUST_SHOW.get(path.name, 0), f"{path.name}: {stills} pictures stored"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_every_notebook_has_one_title_style_and_calls_setup_first(path):
    nb = _load(path)
    title = _source(nb["cells"][0]).splitlines()[0]
    number = path.name.split("_")[0]      # "02", or "02a" for a notebook slotted in between
    assert re.fullmatch(rf"# {number} · \S.*", title), f"{path.name}: title {title!r}, not '# NN · Title'"
    first = _source(_code_cells(nb)[0])
    calls = [n for n in ast.walk(ast.parse(first)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"]
    assert "from tuna_lab.notebook import" in first and calls, f"{path.name}: first code cell does not call setup()"
    # The copied block setup() replaced: display settings made by hand.
    copied = [_source(c).splitlines()[0] for c in _code_cells(nb)
              if "pio.renderers.default" in _source(c) or "pd.set_option" in _source(c)]
    assert not copied, f"{path.name}: display settings set by hand in {copied}"


def test_the_readme_lists_every_notebook_title():
    readme = (NOTEBOOKS / "README.md").read_text(encoding="utf-8")
    titles = [_source(_load(p)["cells"][0]).splitlines()[0].removeprefix("# ") for p in PATHS]
    missing = [t for t in titles if t not in readme]
    assert not missing, f"notebooks/README.md does not show the titles {missing}"


# -- tuna_lab.notebook ---------------------------------------------------------------------

def test_setup_stores_figures_as_json_and_png(monkeypatch):
    import plotly.graph_objects as go
    import plotly.io as pio
    from IPython.display import Image

    from tuna_lab.notebook import RENDERER, setup
    from tuna_lab.widgets import figures

    before = pio.renderers.default, pd.get_option("display.width")
    monkeypatch.setattr(figures, "static", lambda *a: Image(data=b"\x89PNG fake", format="png"))
    try:
        setup()
        assert pio.renderers.default == RENDERER and pd.get_option("display.width") == 120
        bundle = go.Figure(go.Bar(y=[1, 2]))._repr_mimebundle_()
        assert {PLOTLY, "image/png"} <= set(bundle) and "text/html" not in bundle
        setup(static_images=False)
        assert "image/png" not in go.Figure()._repr_mimebundle_()
    finally:
        pio.renderers.default = before[0]
        pd.set_option("display.width", before[1])


def test_importing_the_notebook_helper_is_cheap():
    import subprocess
    import sys

    code = ("import sys, tuna_lab.notebook\n"
            "print(sorted(m for m in ('pandas', 'plotly', 'scipy', 'cvxpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr or out.stdout


def test_milliseconds_converts_and_renames_only_the_time_columns():
    frame = pd.DataFrame({"policy": ["cfs"], "server_seconds": [0.0125], "p99": [0.2], "n": [3]})
    out = milliseconds(frame, ["server_seconds", "p99"])
    assert out.columns.tolist() == ["policy", "server ms", "p99 ms", "n"]
    assert out.iloc[0].tolist() == ["cfs", 12.5, 200.0, 3]
    assert frame["p99"].iloc[0] == 0.2                   # a copy: the caller's table is untouched
    with pytest.raises(AnalysisError, match="no column 'p50'"):
        milliseconds(frame, ["p50"])


def test_log_interval_is_a_t_interval_of_the_logs_and_stays_positive():
    rng = np.random.default_rng(1)
    p99 = np.r_[[0.010, 0.060], rng.lognormal(np.log(0.05), 0.3, 5)]
    table = pd.DataFrame({"policy": ["a", "a"] + ["b"] * 5, "w": 1, "p99": p99})
    out = log_interval(table, ["w", "policy"], confidence=0.9)
    assert out.index.names == ["w", "policy"] and out["n"].tolist() == [2, 5]
    for (_, policy), row in out.iterrows():
        logs = np.log(table.loc[table["policy"] == policy, "p99"])
        low, high = stats.t.interval(0.9, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
        assert row["geomean"] == pytest.approx(np.exp(logs.mean()))
        assert (row["low"], row["high"]) == pytest.approx((np.exp(low), np.exp(high)))
    # Two spread-out trials: a Student t interval of the values goes below zero, this one does not.
    a = p99[:2]
    assert a.mean() - stats.t.ppf(0.95, 1) * a.std(ddof=1) / np.sqrt(2) < 0 < out.loc[(1, "a"), "low"]


def test_log_interval_leaves_out_what_has_no_logarithm_and_refuses_bad_input():
    table = pd.DataFrame({"policy": ["a", "a", "a", "b"], "p99": [0.02, 0.03, 0.0, np.nan]})
    out = log_interval(table, "policy")
    assert out["n"].tolist() == [2, 0] and out.loc["a", "low"] > 0 and np.isnan(out.loc["b", "geomean"])
    with pytest.raises(AnalysisError, match="no column 'p50'"):
        log_interval(table, "policy", "p50")
    for bad in (0, 1, 1.5, True, "0.9"):
        with pytest.raises(AnalysisError, match="confidence"):
            log_interval(table, "policy", confidence=bad)
