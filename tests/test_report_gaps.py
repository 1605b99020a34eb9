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
from tuna_lab.analysis.stats import MIN_INTERVAL_TRIALS, TOO_FEW_TRIALS, scenario_stats, trial_stats
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
    moved = line[line.index("the largest gap"):]
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


# -- issue 49: a verdict under each figure, one row per cell, plain words, one count -----------------------------


def _page(tmp_path_factory, name, **kw):
    """The report of a stored run as text: no script, no tags' entities."""
    import html

    requests, trials, manifests = load_results(str(DATA / name))
    out = tmp_path_factory.mktemp(name) / "r.html"
    manifest = manifests[0] if isinstance(manifests, list) and manifests else None
    write_report(requests, trials, out, manifest=manifest, **kw)
    return html.unescape(re.sub(r"<script.*?</script>", "", out.read_text(), flags=re.DOTALL))


@pytest.fixture(scope="module")
def sched_page(tmp_path_factory):
    return _page(tmp_path_factory, "sched-2cpu")


def _section(page, heading):
    return page.split(f"<h2>{heading}</h2>", 1)[1].split("<h2>", 1)[0]


def test_each_figure_has_its_verdict_in_words_from_the_data(sched_page):
    # Before: the three figures came with no sentence at all.
    speed = _section(sched_page, "Speedup by subscription, model and batch")
    assert ("<strong>What it shows.</strong> round-robin faster than cfs at oversubscribed, model medium, batch 100: "
            "1.24x [1.15, 1.33]") in speed
    assert "cfs slower than round-robin" not in speed                   # said once, the other way
    p99 = _section(sched_page, "p99 by configuration")
    assert ("cfs's p99 differs: 105.1 ms [87.2, 126.7] at 2x1 against 173.5 ms [161.9, 185.9] at 2x2 "
            "(intervals apart)") in p99
    assert "tuna-scatter: no difference shown between configurations" in p99
    stages = _section(sched_page, "Per-stage p99")
    assert stages.count("<strong>What it shows.</strong>") == 2           # one under each of the two figures
    # Each names its configuration: the two sentences, one "no stage" and one "convert moves", are not a contradiction.
    assert "At 2x1, model medium, batch 100, no stage's p99 is shown to differ between policies: in every stage their intervals overlap" in stages
    assert "At 2x2, model medium, batch 100, between policies, the convert stage moves most: cfs 5.8 ms [5.3, 6.4] against round-robin 9.3 ms [8.2, 10.6]" in stages


def test_figure_verdicts_say_too_few_trials_rather_than_judge():
    from tuna_lab.analysis._verdicts import configuration_verdict, stage_verdict

    requests, trials, _ = load_results(str(DATA / "sched-2cpu"))
    per_trial = trial_stats(requests, trials)
    two = per_trial[per_trial["trial"] < 2]
    assert configuration_verdict(two).startswith(f"Between configurations: {TOO_FEW_TRIALS}")
    assert stage_verdict(two, 2, 2).startswith(f"At 2x2, between policies: {TOO_FEW_TRIALS}")


def test_no_grouping_repeats_a_coarser_ones_rows(sched_page, tmp_path_factory):
    # sched-2cpu: one model and batch, so "subscription+model+batch | over / medium / 100" was the "over" row again.
    averages = _section(sched_page, "Average speedup over cfs")
    assert "over / medium / 100" not in averages and averages.count("1.24 [1.15, 1.33] (n=1)") == 1
    import json

    design = json.loads((DATA / "article-2cpu" / "sweep.json").read_text())["design"]
    page = _page(tmp_path_factory, "article-2cpu", article=design)
    # The 16x1 cell's speedup over cfs once (it was three times), and the article's finding quoted once.
    assert page.count("0.96 [0.81, 1.13] (n=1)") == 1
    table = _section(page, "Speedups beside the article's")
    assert table.count("Tuna gains in the undersubscribed range and slows the degradation") == 1
    assert "in the table beside the article's numbers above: not shown twice" in _section(page, "Average speedup over cfs")


def test_a_tail_share_that_reads_the_same_is_never_apart():
    from tuna_lab.analysis.anatomy import anatomy_lines

    requests, trials, _ = load_results(str(DATA / "sweep-2cpu"))
    lines = anatomy_lines(anatomy(requests, trials))
    # Before: "waiting in the backlog (tuna-scatter 100% [100, 100] vs cfs 100% [100, 100], intervals apart)".
    for line in lines:
        assert not re.search(r" (\S+)% \[([^\]]+)\] vs \S+ \1% \[\2\], intervals apart", line), line
        assert "backlog, from the send until a worker starts the request" in line   # what backlog is, at first use
    assert any("no share differs between policies" in line for line in lines)


def test_the_report_explains_its_words_and_names_no_module_or_issue(sched_page, tmp_path_factory):
    for jargon in ("Scenarios:", "tuna_lab.measure", "issue 50", "read_tune", "<th>cell</th>"):
        assert jargon not in sched_page, jargon
    assert "Mean p99 server time (ms) of each application under each policy" in sched_page
    assert "An application is one configuration of W workers x T threads" in sched_page
    assert "value */ factor: from the value divided by a factor to the value times it" in sched_page
    assert "IRQs (interrupt requests" in sched_page
    loaded = _page(tmp_path_factory, "tune-2cpu")
    assert "read_tune" not in loaded and "tuna_lab.measure" not in loaded


def test_the_full_manifest_says_default_as_the_tables_do(sched_page):
    manifest = sched_page.split("Full manifest", 1)[1].split("</details>", 1)[0]
    assert '"spincount": null' not in manifest and '"spincount": "default"' in manifest
    assert 'A wait setting left unset reads "default"' in manifest


def test_the_first_sentence_and_the_verdict_count_p99_one_way(tune):
    # Before: "separate p99 in 1 of 5 comparisons", then "1 of 10 would happen by chance 40%" (5 had no interval).
    from tuna_lab.analysis.summary import scope_sentence

    table = viz.verdict_table(scenario_stats(trial_stats(*tune)))
    scope, said = scope_sentence(tune[1], table), viz.verdict_text(table, "cfs")
    assert "enough to separate p99 in 1 of 10 comparisons (5 of them with too few trials for an interval)" in scope
    assert "No difference shown in the other 4 of 10 (interval holds 1); 5 had too few trials" in said
    assert "1 of the 5 with an interval would happen by chance 23% of the time" in said


def test_a_stage_verdict_of_results_without_stage_timings_is_empty_not_an_error():
    # Your own app's results carry the stage columns, all empty: the report once stopped on them
    # ("Encountered all NA values", tests/test_targets.py in make test-e2e).
    from tuna_lab.analysis._verdicts import stage_verdict

    requests, trials, _ = load_results(str(DATA / "sched-2cpu"))
    per_trial = trial_stats(requests, trials)
    from tuna_lab.server.models import STAGES

    stages = [f"{s}_p99" for s in STAGES]
    assert stages and stage_verdict(per_trial.assign(**{c: float("nan") for c in stages}), 2, 2) == ""
    # One stage timed, the others not: the sentence speaks of the timed one only.
    one = per_trial.assign(**{c: float("nan") for c in stages[1:]})
    assert stages[0].removesuffix("_p99") in stage_verdict(one, 2, 2)
