"""What the HTML report says must be true and readable: gaps found reading the stored runs' reports.

From stored data (notebooks/data), no server: tune-2cpu has cells of 2 valid trials and failed trials
(timeouts, a worker left out); sched-2cpu has a share below 1% with an interval; article-2cpu is a sweep
of the article's design, whose figures the report draws first.
"""

import re
from pathlib import Path

import numpy as np
import pytest

from tuna_lab.analysis import figures as viz
from tuna_lab.analysis.anatomy import anatomy, anatomy_line
from tuna_lab.analysis._failures import failures
from tuna_lab.analysis.report import write_report
from tuna_lab.analysis.stats import MIN_INTERVAL_TRIALS, TOO_FEW_TRIALS, trial_stats
from tuna_lab.analysis.tables import valid_trials
from tuna_lab.measure.store import load_results

DATA = Path(__file__).parent.parent / "notebooks" / "data"


@pytest.fixture(scope="module")
def tune():
    requests, trials, _ = load_results(str(DATA / "tune-2cpu"))
    return requests, trials


def test_stage_bars_draw_no_error_bar_below_three_trials(tune):
    per_trial = trial_stats(*tune)
    counts = per_trial[valid_trials(per_trial)].groupby(["workers", "threads", "policy"]).size()
    assert counts[(2, 2, "cfs")] == 2 and counts[(2, 2, "tuna-scatter")] >= MIN_INTERVAL_TRIALS
    fig = viz.stage_p99_bars(per_trial, 2, 2)
    bars = {t.name: t for t in fig.data}
    # Two trials: no bar (NaN draws none), and the hover and the title say why.
    assert np.isnan(np.asarray(bars["cfs"].error_y.array, float)).all()
    assert all(TOO_FEW_TRIALS in text for text in bars["cfs"].customdata)
    assert TOO_FEW_TRIALS in fig.layout.title.text
    # Three or more: the standard deviation is drawn, as before.
    assert np.isfinite(np.asarray(bars["tuna-scatter"].error_y.array, float)).all()
    assert "std over 3 trials" in bars["tuna-scatter"].customdata[0]


def test_failed_tables_say_no_response_and_use_readable_heads(tune):
    text = failures(*tune)
    errors = text[text.index("Failed requests by error"):]
    assert "<td>-1</td>" not in errors and "<td>no response</td>" in errors
    trials_table = text[:text.index("Failed requests by error")]
    for raw in ("trial_status", "workers_replaced", "worker_share", "master_restarted"):
        assert f"<th>{raw}</th>" not in trials_table
    assert "<th>workers replaced</th>" in trials_table
    # Shares as percents, never 6-decimal fractions.
    assert "<td>23.1%</td>" in trials_table and not re.search(r"<td>\d\.\d{6}</td>", trials_table)


def test_anatomy_point_and_interval_share_one_scale():
    requests, trials, _ = load_results(str(DATA / "sched-2cpu"))
    line = anatomy_line(anatomy(requests, trials))
    # The running share is about 0.2%: written "0.19% [0.16, 0.22]", never "0% [0.16, 0.22]".
    moved = line[line.index("moves most"):]
    assert not re.search(r"\b0% \[0\.", moved)
    assert re.search(r"tuna-scatter 0\.\d+% \[0\.\d+, 0\.\d+\]", moved)


def test_report_shows_every_applications_anatomy_line(tmp_path):
    from tuna_lab.analysis.anatomy import anatomy_lines

    requests, trials, _ = load_results(str(DATA / "sched-2cpu"))
    lines = anatomy_lines(anatomy(requests, trials))
    assert len(lines) == 2 and "at 2x1," in lines[0] and "at 2x2," in lines[1]
    # The summaries' line points to the report for the rest: the report must hold them.
    assert "the report has all" in anatomy_line(anatomy(requests, trials))
    out = write_report(requests, trials, tmp_path / "r.html")
    section = out.read_text().split("<h2>Anatomy of the tail</h2>")[1].split("<h2>")[0]
    assert section.count("Anatomy of the slowest 1%") == 2
    assert "the report has all" not in section


def test_article_report_draws_each_figure_once(tmp_path):
    import json

    requests, trials, _ = load_results(str(DATA / "article-2cpu"))
    design = json.loads((DATA / "article-2cpu" / "sweep.json").read_text())["design"]
    text = write_report(requests, trials, tmp_path / "r.html", article=design).read_text()
    titles = re.findall(r'"title":\{"text":"((?:p99 server time per configuration|Per-stage p99)[^"]*)"', text)
    assert len(titles) == 3 and len(set(titles)) == 3, titles
    assert text.count("not drawn twice") == 2


def test_a_tunes_report_says_its_steps_mix_offered_rates():
    # A tune's steps are trials at the rates its race chose per candidate: a p99 averaged over them is no
    # like-for-like comparison of policies, and the first sentence says so (notebooks/data/tune-2cpu).
    from tuna_lab.analysis import scenario_stats, speedup_summary, trial_stats
    from tuna_lab.analysis.summary import scope_sentence
    from tuna_lab.measure import load_results

    requests, trials, _ = load_results(str(Path(__file__).parent.parent / "notebooks" / "data" / "tune-2cpu"))
    speedups = speedup_summary(scenario_stats(trial_stats(requests, trials)), baselines=("cfs",), by=(None,))
    said = scope_sentence(trials, speedups)
    assert "These are a tune's open-loop steps at 2.5-40 requests/s" in said and "unlike loads" in said
