"""A self-contained HTML report of one experiment.

:func:`write_report` turns the runner's ``requests`` and ``trials`` tables
into one HTML file that needs no network to view: plotly.js is inlined once,
before the first figure, and every later figure reuses it.

Examples
--------
>>> # skipped: writes an HTML file (tests/test_analysis.py writes reports)
>>> write_report(requests, trials, "out/report.html", manifest={"kernel": "6.8"})  # doctest: +SKIP
PosixPath('out/report.html')
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .._files import write_atomic
from ..errors import AnalysisError
from ..measure.evidence import evidence_rows
from ..placement import POLICIES
from . import figures as viz
from ._failures import failures
from ._html import esc as _esc, fmt as _fmt, table as _table
from ._no_valid import cells_without_valid_trial, counted  # noqa: F401 - the first for the report command
from ._report_tables import (
    BASELINES as _BASELINES,
    comparisons,
    cpu_table,
    estimate,
    locality_table,
    one_row_per_cell,
    scenario_table,
    speedup_table,
)
from ._verdicts import configuration_verdict, stage_verdict
from .anatomy import anatomy_notes
from .mechanism import (
    MECHANISM,
    NOT_RECORDED,
    evidence_notes,
    format_evidence,
    has_evidence,
    lead_sentence,
    mechanism_correlations,
    mechanism_table,
)
from .stats import INTERVALS, MACHINE, scenario_stats, speedup_summary, trial_stats
from .summary import ARTICLE_MIN_CPUS, scale_note
from .tables import APPLICATION, check_table, ordered, sort_table, valid_trials

__all__ = ["write_report", "check_report_path"]

# The mark of a report of ours, near its top: what lets a later report replace it, and nothing else.
_GENERATOR = '<meta name="generator" content="tuna-lab report">'
# How every report began before it carried that mark (its title is tuna_lab's unless a caller gave another).
_OLD_START = '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>tuna_lab'
# The files that make a folder a cell (or a cell being written): a report is never written among them.
_CELL_FILES = ("manifest.json", "trials.parquet", "requests.parquet")

# The article profiles its stages on 4x4 (undersubscribed) and 16x16 (oversubscribed).
_ARTICLE_STAGE_CONFIGS = ((4, 4), (16, 16))
_MAX_STAGE_FIGURES = 6
# The article's own numbers and findings (docs/article.md, "The article's results, as it states them"), shown
# beside what a sweep of its design measured; nothing here is a number the article does not give.
_ARTICLE_SPEEDUP = {"cfs": 1.15, "round-robin": 1.13}
_ARTICLE_FINDINGS = {
    "all": "Over the 972 scenarios, Tuna's average p99 speedup is {speedup:.2f}x over {baseline}.",
    "subscription": "Tuna gains in the undersubscribed range and slows the degradation in the oversubscribed one.",
    "model": "Tuna's gain shrinks as the model grows; it outperforms CFS in every model group. With the small "
             "model, round-robin is comparable to Tuna.",
    "batch": "Tuna's gain shrinks as the batch grows; it outperforms CFS in every batch group.",
    "p99": "Across the 36 configurations (medium model, batch 100), runtime improves with more threads while "
           "undersubscribed and degrades while oversubscribed, for every policy. Tuna gains in the "
           "undersubscribed range and slows the degradation in the oversubscribed one. Round-robin spikes "
           "where T divides the cores, or where the cores do not divide WT.",
    "stages": "At 4x4, Tuna's gain comes mostly from the SHAP stage. At 16x16, Tuna is faster in every stage "
              "and round-robin is consistently slower.",
}
#: Manifest fields shown in the header, each with the keys it may be stored under.
_HEADER = (
    ("CPU", ("cpu_model", "cpu")),
    ("kernel", ("kernel", "kernel_release")),
    ("commit", ("commit", "git_commit")),
    ("command line", ("command", "command_line", "cmdline", "argv")),
    ("date", ("date", "started", "started_at", "created_at", "timestamp")),
)
_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
dl.manifest { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dl.manifest dt { font-weight: 600; } dl.manifest dd { margin: 0; font-family: monospace; }
p.note { color: #555; font-size: 0.9em; }
"""


def write_report(requests, trials, path, title="tuna_lab experiment", manifest=None, threads=None, machines=None,
                 article=None, left_out=None, no_valid=None):
    """Write a self-contained HTML report of an experiment.

    The report holds, in order: a header from ``manifest``; the scenario
    table (mean p99 in ms with its 95% confidence interval, one column per
    policy; every interval is written by
    :func:`~tuna_lab.analysis.stats.format_interval`, the way ``run`` prints
    it, and :data:`~tuna_lab.analysis.stats.INTERVALS` says what it is);
    the average speedups over cfs and over round-robin, overall and
    by subscription, model, batch and their combinations (with a figure of
    the combinations); one p99-by-configuration figure per model and batch;
    per-stage p99 bars; and the failed trials with their reasons (and the
    failed requests by error).

    Results of several machines (a ``machine`` column: a sweep on a
    cluster, see :func:`~tuna_lab.measure.store.load_results`) add a per-machine
    comparison after the scenario table - each machine's CPU, topology and
    speedups over cfs, and each application's mean p99 on every machine -
    and have their figures drawn machine by machine.

    Per-stage bars are drawn for every configuration when there are at most
    six ``(W, T, model, batch)``; otherwise for the article's 4x4 and 16x16
    (or, missing those, the configurations with the fewest and the most
    threads) of the article's medium model with batch 100 (or the first
    model and batch present).

    Parameters
    ----------
    requests, trials : pandas.DataFrame
        The runner's tables (see :func:`tuna_lab.analysis.trial_stats`).
    path : str or os.PathLike
        Where to write; parent directories are created. The file is written
        to a temporary file beside it and moved into place.
    title : str, default "tuna_lab experiment"
    threads : pandas.DataFrame, optional
        Per-worker CPU and NUMA records (:func:`~tuna_lab.measure.store.load_thread_cpu`);
        adds each worker's NUMA locality next to its p99.
    manifest : mapping, optional
        Run metadata; ``cpu_model``, ``kernel``, ``commit``, ``command``
        (a string or an argv list) and ``date`` are shown in the header, the
        whole mapping in a collapsed block.
    machines : mapping, optional
        Per machine name, a manifest of a cell measured there (its
        ``hostname``, ``cpu_model``, ``fingerprint``, ``kernel``, ``cpus``
        describe the machine in the comparison).
    article : mapping, optional
        The design of a sweep of the article's experiment (``sweep.json``'s
        ``"design"``, :meth:`ArticleDesign.to_dict
        <tuna_lab.measure.sweeps.article.ArticleDesign.to_dict>`). Adds, first, the
        article's figures drawn from these results with the article's number
        or finding beside each: the speedups over cfs and round-robin by
        subscription, model and batch with their intervals, the p99 over the
        configurations and the stage breakdown at its 4x4 and 16x16 (scaled);
        on fewer than 16 CPUs, a plain note that this is the tiny version.
        Those figures are not drawn again in the report's own figure sections
        (a note there says so).
    left_out : mapping, optional
        ``{cell: why}`` of the cells that could not be read and were left out
        (``report --skip-unreadable``): said first, since every average lacks them.
    no_valid : mapping, optional
        ``{cell: why}`` of the cells with no valid trial (``report`` finds them): said first, as ``left_out``.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    AnalysisError
        If a table is empty or misses a column, or ``manifest`` is not a mapping; or ``path`` is
        a file that is no report of ours, or lies inside a cell folder (:func:`check_report_path`):
        refused before anything is computed.

    Examples
    --------
    >>> # skipped: writes an HTML file (tests/test_analysis.py writes reports)
    >>> write_report(requests, trials, "report.html", manifest={"commit": "ba0cf89"})  # doctest: +SKIP
    PosixPath('report.html')
    """
    check_report_path(path)
    if manifest is not None and not isinstance(manifest, Mapping):
        raise AnalysisError(f"manifest must be a mapping, not {type(manifest).__name__}")
    check_table(trials, "trials", ("policy", "trial", "trial_status"))
    # Every table by the types its columns must hold (measure.readable): one line, not a traceback deep inside.
    from ..measure.readable import column_problem

    for frame, name in ((trials, "trials"), (requests, "requests"), (threads, "threads")):
        why = column_problem(frame, name) if isinstance(frame, pd.DataFrame) else None
        if why:
            raise AnalysisError(f"{name} table: {why}")
    per_trial = trial_stats(requests, trials)
    scenarios = scenario_stats(per_trial)
    summary = speedup_summary(scenarios, baselines=_BASELINES)

    finest = summary[summary["group"].eq("subscription+model+batch") & summary["speedup"].notna()]
    single = _applications(scenarios) == 1
    if article is not None and not isinstance(article, Mapping):
        raise AnalysisError(f"article must be a mapping (a sweep's design), not {type(article).__name__}")
    # The article's section draws its p99 and per-stage figures first: the sections below leave those out
    # rather than draw the same figure twice.
    article_parts, drawn = _article_sections(per_trial, scenarios, article) if article is not None else ([], set())
    sections = [
        # An application: one configuration (W x T), model and batch (and wait setting) - what a results cell holds.
        ("Mean p99 server time (ms) of each application under each policy", [scenario_table(scenarios)]),
        *(_machine_sections(per_trial, scenarios, machines) if MACHINE in per_trial.columns else []),
        ("Policy comparisons", [comparisons(scenarios, single)]),
        *([] if single else [(f"Average speedup over {b}", [_averages(summary, b, article)]) for b in _BASELINES]),
        ("Speedup by subscription, model and batch",
         [viz.speedup_bars(finest), *_said(_speedup_verdict(finest))] if not finest.empty else []),
        *[section for on, rows in _machine_parts(per_trial)
          for section in _figure_sections(rows, on, drawn if on is None else set())],
        ("Latency and CPU cost", [cpu_table(trials)]),
        ("Scheduler evidence: what each policy did to the threads", _mechanism_items(trials, manifest)),
        # Issue 50: what the slowest requests themselves waited on (docs/anatomy.md), or why it is not shown.
        # Every application's line: the one-line summaries show the first and say the report has all.
        ("Anatomy of the tail", [f"<p>{_esc(line)}</p>" for line in anatomy_notes(requests, trials)]),
        ("NUMA locality per worker", [locality_table(requests, threads)] if threads is not None
         and "numa_locality" in getattr(threads, "columns", ()) else []),
        ("Failed trials", [failures(requests, trials)]),
    ]
    sections = article_parts + sections
    # The article's section says it at length; any other report of a small machine says it in one line.
    small = scale_note(int(per_trial["cpus"].max())) if article is None else ""
    # What the trials can tell first (issue 49), then what was left out of them, then what they were.
    parts = [f"<h1>{_esc(title)}</h1>", *_verdict(requests, trials, scenarios), *_left_out(left_out),
             *_left_out(no_valid, False), _header(manifest), _overview(requests, per_trial, scenarios),
             *([f"<p><strong>{_esc(small)}</strong></p>"] if small else []), *_render(sections)]
    document = ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                f"{_GENERATOR}\n<title>{_esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
                + "\n".join(parts) + "\n</body>\n</html>\n")
    # Whole or not at all, never through a link (:func:`tuna_lab._files.write_atomic`).
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return Path(write_atomic(Path(path), document))


# -- pieces ---------------------------------------------------------------------------------


def _render(sections):
    """HTML of ``(heading, items)`` sections; plotly.js is inlined with the first figure only."""
    html_parts, inlined = [], False
    for heading, items in sections:
        if not items:
            continue
        html_parts.append(f"<h2>{_esc(heading)}</h2>")
        for item in items:
            if isinstance(item, go.Figure):
                item = item.to_html(full_html=False, include_plotlyjs=not inlined, default_height="480px",
                                    config={"displaylogo": False})
                inlined = True
            html_parts.append(item)
    return html_parts


def _said(text):
    """The verdict under a figure, in words from its data (issue 49); ``[]`` when there is nothing to say."""
    return [f"<p><strong>What it shows.</strong> {_esc(text)}</p>"] if text else []


def _speedup_verdict(rows):
    """:func:`~tuna_lab.analysis.figures.verdict_text` of the speedups a figure draws (``""`` if it refuses)."""
    from ..errors import TunaError

    # cfs against round-robin is said once, the other way (as the comparisons table does).
    rows = rows[~(rows["baseline"].eq("round-robin") & rows["policy"].eq("cfs"))]
    try:
        return viz.verdict_text(rows)
    except TunaError:
        return ""


def _averages(summary, baseline, article):
    """:func:`speedup_table`, or a note where every row it keeps is in the article's table above already."""
    if article is not None:
        rows = summary[summary["baseline"].eq(baseline)]
        label = rows[[c for c in ("subscription", "model", "batch") if c in rows.columns]].astype("string")
        kept = one_row_per_cell(rows, label.fillna("").agg(" / ".join, axis=1))[0]
        if kept["group"].isin(["all", "subscription", "model", "batch"]).all():
            return (f'<p class="note">Every average over {_esc(baseline)} is in the table beside the article\'s '
                    "numbers above: not shown twice.</p>")
    return speedup_table(summary, baseline)


def _shown_manifest(value, key=None):
    """The manifest as the tables show it: an unset wait setting (null, or a spin count of -1) reads "default"."""
    if isinstance(value, Mapping):
        return {k: _shown_manifest(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown_manifest(v) for v in value]
    if key in ("spincount", "wait_policy") and value in (None, -1):
        return "default"
    return value


def _header(manifest):
    if not manifest:
        return '<p class="note">No manifest.</p>'
    rows = []
    for label, keys in _HEADER:
        key = next((k for k in keys if manifest.get(k) not in (None, "")), None)
        if key is None:
            continue
        value = manifest[key]
        if isinstance(value, (list, tuple)):
            value = shlex.join(map(str, value))
        rows.append(f"<dt>{_esc(label)}</dt><dd>{_esc(value)}</dd>")
    # The serving CPUs' clocks, the runtimes' wait settings (KMP_BLOCKTIME, ONNX Runtime's spinning).
    rows += [f"<dt>{_esc(label)}</dt><dd>{_esc(text)}</dd>" for label, text in evidence_rows(manifest)]
    client = manifest.get("client_cpus")
    if isinstance(client, dict) and client.get("note"):
        # Where the load generator ran: on CPUs of its own, or sharing the server's.
        rows.append(f"<dt>load generator</dt><dd>{_esc(client['note'])}</dd>")
    full = json.dumps(_shown_manifest(dict(manifest)), indent=2, default=str, sort_keys=True)
    return (f'<dl class="manifest">{"".join(rows)}</dl>'
            f"<details><summary>Full manifest</summary><p class=\"note\">A wait setting left unset reads "
            f"\"default\" (the runtime's own), as in the tables.</p><pre>{_esc(full)}</pre></details>")


def _overview(requests, per_trial, scenarios):
    ok = int(per_trial["ok"].sum())
    cpus = ", ".join(map(str, sorted(per_trial["cpus"].unique())))
    counts = scenarios["n_trials"]
    machines = (f" on {per_trial[MACHINE].nunique()} machines" if MACHINE in per_trial.columns else "")
    apps = _applications(scenarios)
    valid = f"{counts.min()}" if counts.min() == counts.max() else f"{counts.min()}-{counts.max()}"
    return (f'<p class="note">{_n(len(requests), "request")} ({ok} ok) in {_n(len(per_trial), "trial")}; '
            f"{_n(scenarios['policy'].nunique(), 'policy', 'policies')}; {_n(apps, 'application')} on {cpus} "
            f"logical cores{machines}; {valid} valid trial{'' if counts.max() == 1 else 's'} per policy and "
            "application. An application is one configuration of W workers x T threads with its model, batch and "
            f"wait settings (what one results cell holds). {_esc(INTERVALS)} (value */ factor: from the value "
            "divided by a factor to the value times it.)</p>")


def _applications(scenarios):
    """Applications as every table counts them: the wait factors and the machine are among their keys."""
    return len(scenarios[[c for c in (MACHINE, *APPLICATION) if c in scenarios.columns]].drop_duplicates())


def _n(count, word, plural=None):
    """``"1 application"``, ``"2 applications"``."""
    return f"{count} {word if count == 1 else plural or word + 's'}"


def _verdict(requests, trials, scenarios):
    """The report's first words: what these trials can tell, and the verdict on every policy against cfs.

    From each application's speedups over cfs (:func:`~tuna_lab.analysis.figures.verdict_table`): what
    the trials resolve (:func:`~tuna_lab.analysis.summary.scope_sentence`), the speedups in words
    (:func:`~tuna_lab.analysis.figures.verdict_text`), and what separates the policies
    (:func:`~tuna_lab.analysis.mechanism.lead_sentence`). A part that cannot be said is left out.
    """
    from ..errors import TunaError
    from .summary import scope_sentence

    if not valid_trials(trials).any():
        return ["<p><strong>What these results can tell.</strong> Nothing: no trial is valid (the failed trials "
                "below say why).</p>"]
    try:
        # Each application's own speedups, not their average: what the trials resolve is read off these.
        table = viz.verdict_table(scenarios)
    except TunaError:
        return []
    said = []
    for say in (lambda: scope_sentence(trials, table), lambda: viz.verdict_text(table, "cfs"),
                lambda: lead_sentence(trials) if has_evidence(trials) else ""):
        try:
            text = say()
        except TunaError:
            continue
        if text:
            said.append(text)
    return [f"<p><strong>What these results can tell.</strong> {_esc(' '.join(said))}</p>"] if said else []


# -- the article's experiment --------------------------------------------------------------


def _article_sections(per_trial, scenarios, design):
    """The article's figures from a sweep of its design, each with the article's number or finding beside it.

    Returns
    -------
    sections : list
        ``(heading, items)`` pairs, as :func:`_render` takes them.
    drawn : set
        The keys (:func:`_figure_sections`'s) of the p99 and per-stage figures drawn here, of every machine's
        trials together: the later sections do not draw them again.
    """
    cpus = int(design.get("cpus") or per_trial["cpus"].max())
    pairs = [tuple(p) for p in design.get("pairs", ())]
    intro = [f'<p>This sweep ran the article\'s design on {cpus} CPUs: {len(pairs)} configurations '
             f'({_esc(", ".join(f"{w}x{t}" for w, t in pairs))}), models {_esc(", ".join(design.get("models", ())))}, '
             f'batches {_esc(", ".join(map(str, design.get("batches", ()))))}, {design.get("trials")} trials x '
             f'{design.get("requests")} requests per policy. The article: 36 configurations x 3 models x 3 '
             "batches, 5 trials x 1,000 requests, on 32 logical CPUs.</p>"]
    if design.get("summary"):
        intro.append(f'<p class="note">Cut to its budget: {_esc(design["summary"])}.</p>')
    if cpus < ARTICLE_MIN_CPUS:
        threads = sorted({t for _, t in pairs})
        intro.append(
            f"<p><strong>This is the tiny version.</strong> On {cpus} CPUs the article's pairs scale to "
            f"T = {', '.join(map(str, threads))} threads per worker"
            + (" - with T = 1 scatter and compact are one mapping, and Tuna's mode term is 0" if threads == [1]
               else "")
            + f"; the effect the article measured needs more cores (it used 32 logical CPUs; give this "
              f"command a machine of {ARTICLE_MIN_CPUS} or more). Read the numbers below as the method at work, "
              "not as a reproduction.</p>")
    sections = [("The article's experiment on this machine", intro),
                ("Speedups beside the article's", [_article_speedups(scenarios)])]
    drawn = set()
    stage_trials, wp, sc = _one_wait(per_trial)
    valid = stage_trials[valid_trials(stage_trials)]
    present = set(valid[["model", "batch"]].drop_duplicates().itertuples(index=False, name=None))
    model, batch = ("medium", 100) if ("medium", 100) in present else (sorted(present, key=str) or [(None, None)])[0]
    if model is not None:
        note = f'<p class="note">The article: {_esc(_ARTICLE_FINDINGS["p99"])}</p>'
        sections.append((f"p99 over the configurations ({model} model, batch {batch})",
                         [viz.p99_by_configuration(stage_trials, model=model, batch=batch, wait_policy=wp,
                                                   spincount=sc),
                          *_said(configuration_verdict(stage_trials, model, batch, wp, sc)), note]))
        drawn.add(("p99", model, batch, wp, sc))
        have = set(valid[valid["model"].eq(model) & valid["batch"].eq(batch)][["workers", "threads"]]
                   .itertuples(index=False, name=None))
        stages = [tuple(p) for p in design.get("stage_pairs", ()) if tuple(p) in have]
        names = dict(zip(stages, ("4x4", "16x16"))) if len(stages) == 2 else {}
        figures = [item for w, t in stages
                   for item in (viz.stage_p99_bars(stage_trials, w, t, model=model, batch=batch, wait_policy=wp,
                                                   spincount=sc),
                                *_said(stage_verdict(stage_trials, w, t, model, batch, wp, sc)))]
        drawn.update(("stages", w, t, model, batch, wp, sc) for w, t in stages)
        scaled = ", ".join(f"{w}x{t} for the article's {names[(w, t)]}" for w, t in stages if (w, t) in names)
        note = (f'<p class="note">{_esc(scaled)}. ' if scaled else '<p class="note">') + \
            f'The article: {_esc(_ARTICLE_FINDINGS["stages"])}</p>'
        sections.append(("Per-stage p99 at the article's 4x4 and 16x16 (scaled)", figures + [note] if figures else
                         ['<p class="note">The stage cells were not run (see the budget above).</p>']))
    return sections, drawn


def _article_speedups(scenarios):
    """Every policy's speedup over cfs and round-robin, overall and by S, M and B, with the article's beside it."""
    present = set(scenarios["policy"])
    baselines = [b for b in _BASELINES if b in present]
    if not baselines or len(present) < 2:
        return '<p class="note">No policy ran beside cfs or round-robin: nothing to set beside the article.</p>'
    summary = speedup_summary(scenarios, baselines=baselines, by=(None, "subscription", "model", "batch"))
    rows = []
    label = summary[[c for c in ("subscription", "model", "batch") if c in summary.columns]].astype("string")
    summary = one_row_per_cell(summary, label.fillna("").agg(" / ".join, axis=1))[0]
    quoted = set()
    for r in summary[summary["speedup"].notna()].itertuples(index=False):
        if r.baseline == "round-robin" and r.policy == "cfs":
            continue                                    # cfs against round-robin is shown once, the other way
        column = {"all": None}.get(r.group, r.group)
        if str(r.policy) not in ("tuna-scatter", "tuna-compact"):
            finding = "-"                               # the article's numbers and findings are its two Tuna modes'
        elif r.group == "all":
            finding = _ARTICLE_FINDINGS["all"].format(speedup=_ARTICLE_SPEEDUP[r.baseline], baseline=r.baseline)
        else:
            finding = _ARTICLE_FINDINGS[r.group]
        if finding != "-" and finding in quoted:
            finding = "(as above)"                      # the article's words once, not on every row
        quoted.add(finding)
        rows.append({"baseline": r.baseline, "policy": r.policy, "group": r.group,
                     "value": "all" if column is None else str(getattr(r, column)),
                     "speedup here [95% interval]": f"{estimate(r.speedup, r.ci_low, r.ci_high)} (n={r.n})",
                     "the article": finding})
    return _table(pd.DataFrame(rows), "Speedup: mean over applications of (baseline mean p99) / (policy mean p99), "
                                      "above 1 the policy is faster; the interval is from the trials' spread "
                                      "(an interval holding 1: the trials cannot tell the policies apart). The "
                                      "article gives means only, and its Tuna is tuna-scatter here.")


# -- several machines ----------------------------------------------------------------------


def _machine_parts(per_trial):
    """``(machine, its rows)`` for each machine; one ``(None, per_trial)`` for the results of one machine."""
    if MACHINE not in per_trial.columns:
        return [(None, per_trial)]
    return [(name, rows) for name, rows in per_trial.groupby(MACHINE, sort=True, observed=True)]


def _figure_sections(per_trial, machine, drawn=frozenset()):
    """The p99-by-configuration and per-stage sections of one machine's trials (or of all, ``machine`` None).

    ``drawn`` holds the keys (``("p99", model, batch, wait_policy, spincount)``, ``("stages", W, T, model,
    batch, wait_policy, spincount)``) of figures of these same trials drawn earlier (the article's section):
    they are not drawn again, and a note says where they are.
    """
    on = "" if machine is None else f" - machine {machine}"
    # Per-stage bars for one wait policy: the runtime's default when it was measured.
    stage_trials, wp, sc = _one_wait(per_trial)
    p99, stages, p99_above, stages_above = [], [], 0, 0
    for m, b, w, s in _model_batches(per_trial):
        if ("p99", m, b, w, s) in drawn:
            p99_above += 1
        else:
            p99 += [viz.p99_by_configuration(per_trial, model=m, batch=b, wait_policy=w, spincount=s),
                    *_said(configuration_verdict(per_trial, m, b, w, s))]
    for w, t, m, b in _stage_configurations(stage_trials):
        if ("stages", w, t, m, b, wp, sc) in drawn:
            stages_above += 1
        else:
            stages += [viz.stage_p99_bars(stage_trials, w, t, model=m, batch=b, wait_policy=wp, spincount=sc),
                       *_said(stage_verdict(stage_trials, w, t, m, b, wp, sc))]
    return [
        (f"p99 by configuration{on}", p99 + _drawn_above(p99_above)),
        (f"Per-stage p99{on}", stages + _drawn_above(stages_above)),
    ]


def _drawn_above(count):
    """The note of a section that leaves out ``count`` figures the article's section drew (``[]`` for none)."""
    if not count:
        return []
    return [f'<p class="note">{_n(count, "figure")} of this section {"is" if count == 1 else "are"} drawn above, '
            "in the article's section, and not drawn twice.</p>"]


def _machine_sections(per_trial, scenarios, machines):
    """The per-machine comparison: what each machine is, its speedups over cfs, each application's p99 on each."""
    summary = speedup_summary(scenarios, baselines=("cfs",), by=(MACHINE,))
    drawn = summary[summary["speedup"].notna()]
    return [
        ("Machines", [_machines_table(per_trial, scenarios, summary, machines or {})]),
        ("Speedup over cfs by machine", [viz.speedup_bars(drawn, group=MACHINE)] if not drawn.empty else []),
        ("Mean p99 (ms) of each application on each machine", [_p99_by_machine(scenarios)]),
    ]


def _machines_table(per_trial, scenarios, summary, machines):
    valid = per_trial[valid_trials(per_trial)]
    apps = scenarios.drop_duplicates([MACHINE, "workers", "threads", "cpus", "model", "batch", *_WAIT])
    rows = []
    for name in sorted(per_trial[MACHINE].unique()):
        meta = machines.get(name, {})
        row = {"machine": name, "host": meta.get("hostname", "-"), "CPU": meta.get("cpu_model", "-"),
               "CPUs": len(meta["cpus"]) if isinstance(meta.get("cpus"), list) else "-",
               "fingerprint": meta.get("fingerprint", "-"), "kernel": meta.get("kernel", "-"),
               "applications": int(apps[MACHINE].eq(name).sum()), "valid trials": int(valid[MACHINE].eq(name).sum())}
        own = summary[summary[MACHINE].eq(name)]
        for r in own.itertuples(index=False):
            row[f"{r.policy} vs cfs"] = "-" if np.isnan(r.speedup) else f"{r.speedup:.3f} (n={r.n})"
        rows.append(row)
    return _table(pd.DataFrame(rows), "Speedup: mean over the machine's applications of (cfs mean p99) / (policy "
                                      "mean p99), above 1 the policy is faster there. A machine is its hostname "
                                      "and the fingerprint of the CPUs its worker could use.")


def _p99_by_machine(scenarios):
    label = scenarios["workers"].astype(str) + "x" + scenarios["threads"].astype(str)
    table = scenarios.assign(configuration=label, value=_fmt(scenarios["mean_p99"] * 1e3, 2).to_numpy())
    index = ["model", "batch", "configuration", "wait_policy", "spincount", "policy"]
    wide = table.pivot_table(index=index, columns=MACHINE, values="value", aggfunc="first", sort=False)
    wide = sort_table(wide.reset_index(), index)
    wide.columns.name = None
    return _table(wide, "'-' where a machine did not run the application; the same application on several "
                        "machines compares the machines.")


_WAIT = ["wait_policy", "spincount"]


def _model_batches(per_trial):
    keys = ["model", "batch", *_WAIT]
    pairs = sort_table(per_trial.loc[valid_trials(per_trial), keys].drop_duplicates(), keys)
    return list(pairs.itertuples(index=False, name=None))


def _one_wait(per_trial):
    """``per_trial`` restricted to one (wait policy, spin count): the default if present, else the first."""
    waits = list(per_trial[_WAIT].drop_duplicates().itertuples(index=False, name=None))
    wait = ("default", -1) if ("default", -1) in waits else sorted(waits, key=str)[0]
    keep = per_trial["wait_policy"].eq(wait[0]) & per_trial["spincount"].eq(wait[1])
    return per_trial[keep], wait[0], wait[1]


def _stage_configurations(per_trial):
    """``(W, T, model, batch)`` to draw per-stage bars for (see :func:`write_report`)."""
    valid = per_trial[valid_trials(per_trial)]
    present = sort_table(valid[["model", "batch", "workers", "threads"]].drop_duplicates(),
                         ["model", "batch", "workers", "threads"])
    if len(present) <= _MAX_STAGE_FIGURES:
        return [(w, t, m, b) for m, b, w, t in present.itertuples(index=False, name=None)]
    pairs = list(present[["model", "batch"]].drop_duplicates().itertuples(index=False, name=None))
    model, batch = ("medium", 100) if ("medium", 100) in pairs else pairs[0]
    configs = present[present["model"].eq(model) & present["batch"].eq(batch)]
    have = set(configs[["workers", "threads"]].itertuples(index=False, name=None))
    chosen = [c for c in _ARTICLE_STAGE_CONFIGS if c in have]
    if not chosen:
        by_size = configs.assign(_wt=configs["workers"] * configs["threads"]).sort_values(
            ["_wt", "workers"], kind="stable")
        chosen = list(dict.fromkeys([tuple(by_size.iloc[i][["workers", "threads"]]) for i in (0, -1)]))
    return [(w, t, model, batch) for w, t in chosen]


def _mechanism_items(trials, manifest):
    """The scheduler evidence per policy (a table and a figure), then how each quantity relates to p99."""
    notes = evidence_notes(manifest)
    if not has_evidence(trials):
        return [f'<p class="note">Scheduler evidence {_esc(NOT_RECORDED["missing"])}.</p>']
    table = mechanism_table(trials, notes)
    if table.empty:
        # Every trial failed (a loaded machine's demo): no mean to show, and the failed trials say why.
        return ['<p class="note">No valid trial, so no scheduler evidence to show: the failed trials below say '
                "why.</p>"]
    keys = [c for c in (MACHINE, "workers", "threads", "cpus", "model", "batch", "wait_policy", "spincount")
            if c in table.columns]
    units = {e.column: e for e in MECHANISM}
    cell = [r.note or format_evidence(r.mean, r.ci_low, r.ci_high, units[r.evidence], unit=False)
            for r in table.itertuples(index=False)]
    label = table["label"] + table["evidence"].map(lambda c: f" ({units[c].unit})" if units[c].unit else "")
    wide = table.assign(quantity=label, cell=cell).pivot_table(
        index=keys + ["quantity"], columns="policy", values="cell", aggfunc="first", sort=False)
    wide = wide[ordered(wide.columns, POLICIES)].reset_index()
    wide.columns.name = None
    correlations = mechanism_correlations(trials, notes)
    rho = [estimate(r.rho, r.ci_low, r.ci_high) if np.isfinite(r.rho) else "-"
           for r in correlations.itertuples(index=False)]
    related = correlations[keys + ["label", "trials"]].assign(**{"Spearman rho vs p99": rho,
                                                                  "what it says": correlations["sentence"]})
    return [
        _table(wide, "Per request over the server's threads (master, front ends, workers and their pools), "
                     "measured over the trial's load: run-queue wait (schedstat: time runnable but not running), "
                     "migrations (moves between CPUs), involuntary switches (preemptions); foreign CPU share: "
                     "the share of the serving CPUs' time used by anything else (other processes, the load "
                     "generator where it shares them, interrupts); IRQs (interrupt requests: the interrupts the serving "
                     "CPUs handled, from devices and the kernel). "
                     "Mean over valid trials [95% interval, on the log scale, as the p99's]; 'not recorded' "
                     "says why a quantity is missing - it is never a 0."),
        viz.mechanism_bars(table),
        _table(related.rename(columns={"label": "quantity"}),
               "Across each application's valid trials (every policy together): Spearman's rank correlation of "
               "the quantity with the trial's p99 [95% percentile bootstrap interval]. Weak where the interval "
               "holds 0 or there are too few trials; a strong one says they move together in these trials, "
               "not that one causes the other."),
    ]


def check_report_path(path):
    """Refuse (:class:`AnalysisError`, one line) a report path that would replace something not a report of ours.

    ``report X -o X/<cell>/trials.parquet`` once replaced a measurement with
    HTML. Refused: a path inside a cell folder (a folder holding a cell's
    files, finished, partial or being written), and an existing file that is
    not a report this function's writer made (it carries a mark near its
    top). A symbolic link there is replaced, never followed, so it is no
    refusal: what it points to is left alone.

    Examples
    --------
    >>> check_report_path("/etc/hostname")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.AnalysisError: report path /etc/hostname is a file that is no tuna-lab report; refusing to replace it (give a new file name)
    """
    import os
    import stat

    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    while True:
        if any(os.path.lexists(os.path.join(folder, name)) for name in _CELL_FILES):
            raise AnalysisError(f"report path {path} lies inside the results cell {folder}; write the report "
                                "outside it")
        if os.path.dirname(folder) == folder:
            break
        folder = os.path.dirname(folder)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise AnalysisError(f"report path {path} cannot be looked at ({exc.strerror or exc})") from None
    if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return                                  # a link is replaced, not followed; a folder is refused by the write
    if not stat.S_ISREG(st.st_mode):
        raise AnalysisError(f"report path {path} is no regular file; refusing to replace it (give a new file name)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            head = os.read(fd, 4096).decode("utf-8", errors="replace")
        finally:
            os.close(fd)
    except OSError as exc:
        raise AnalysisError(f"report path {path} cannot be read to see whether it is a report "
                            f"({exc.strerror or exc})") from None
    if _GENERATOR not in head and not head.startswith(_OLD_START):
        raise AnalysisError(f"report path {path} is a file that is no tuna-lab report; refusing to replace it "
                            "(give a new file name)")


def _left_out(left_out, unreadable=True):
    """The report's first words when cells were left out (unreadable, or with no valid trial): which, and why."""
    if not left_out:
        return []
    items = "".join(f"<li><code>{_esc(cell)}</code>: {_esc(why)}</li>" for cell, why in sorted(left_out.items()))
    one = len(left_out) == 1
    has, are = ("has", "is") if one else ("have", "are")
    return [f"<p><strong>{counted(left_out)} {'could not be read' if unreadable else f'{has} no valid trial'} and "
            f"{are} left out of every figure and "
            f"average below{' (--skip-unreadable)' * unreadable}:</strong></p><ul>{items}</ul>"]
