"""What ``run``, ``demo`` and the report say first: what the trials can tell, and the verdict in words (issue 49).

On stored runs of this repository (notebooks/data) and small tables built here: no server is started.
"""

import html
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuna_lab.analysis import summarize
from tuna_lab.analysis.figures import verdict_table, verdict_text
from tuna_lab.analysis.report import write_report
from tuna_lab.analysis.stats import MIN_INTERVAL_TRIALS, format_interval, scenario_stats, trial_stats
from tuna_lab.analysis.summary import scope_sentence
from tuna_lab.analysis.tables import shown_defaults
from tuna_lab.measure.experiment import load_results

DATA = Path(__file__).resolve().parent.parent / "notebooks" / "data"
# One cell, 5 trials x 1,000 requests of cfs, round-robin and tuna-scatter on 2 CPUs, a CPU per worker (2 x 1):
# every speedup interval holds 1. Its neighbour, 2 x 2 (four threads on two CPUs), separates both from cfs.
CELL = DATA / "sched-2cpu" / "w2-t1-medium-b100"
OVER = DATA / "sched-2cpu" / "w2-t2-medium-b100"


@pytest.fixture(scope="module")
def cell():
    requests, trials, _ = load_results(CELL)
    return requests, trials


def _text(path):
    """A report's words: no script, no tags, entities decoded."""
    page = re.sub(r"<script.*?</script>", "", Path(path).read_text("utf-8"), flags=re.DOTALL)
    return html.unescape(page)


def _section_rows(page, heading):
    """The body rows (lists of cell texts) of the first table after ``<h2>heading</h2>``."""
    part = page.split(f"<h2>{heading}</h2>", 1)[1].split("<h2>", 1)[0]
    body = part.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", row, flags=re.DOTALL)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, flags=re.DOTALL)]


# -- the first sentence: what these trials can and cannot tell ----------------------------------------------


def test_the_first_sentence_counts_the_trials_and_says_what_p99_cannot_separate(cell):
    requests, trials = cell
    s = summarize(requests, trials)
    assert s.scope.startswith("5 trials x 1000 requests per policy on 2 CPUs: ")
    # The resolution is the narrowest speedup interval's factor (value */ factor), recomputed here.
    factor = min(math.sqrt(r.ci_high / r.ci_low) for r in s.speedups.itertuples())
    narrow = s.speedups.loc[(s.speedups["ci_high"] / s.speedups["ci_low"]).idxmin()]
    closer = f"{factor - 1:.0%}" if factor < 2 else f"a factor of {factor:.1f}"
    assert (f"too few to separate p99s closer than {closer} (the narrowest p99 speedup interval is "
            f"{format_interval(narrow['ci_low'], narrow['ci_high'])})") in s.scope
    assert "enough to separate p99" not in s.scope                # no interval here excludes 1
    assert s.to_dict()["scope"] == s.scope and "\n" not in s.scope


def test_below_three_trials_the_first_sentence_says_there_is_no_interval(cell):
    requests, trials = cell
    two = trials[trials["trial"] < MIN_INTERVAL_TRIALS - 1]
    s = summarize(requests.merge(two[["policy", "trial"]]), two)
    assert s.scope == ("2 trials x 1000 requests per policy on 2 CPUs: too few for an interval (it takes "
                       f"{MIN_INTERVAL_TRIALS} trials of a policy), so they cannot tell whether any policy "
                       "differed from cfs.")


def test_a_separating_quantity_is_named_and_counts_are_ranges_only_where_they_differ():
    """Two applications, one with a policy short of a trial: "2-3 trials"; migrations separate, p99 does not."""
    rows = []
    for workers in (2, 3):
        for policy, migrations in (("cfs", [0.30, 0.25, 0.35]), ("tuna-scatter", [0.0, 0.0, 0.0])):
            for trial in range(3 if (workers, policy) != (3, "tuna-scatter") else 2):
                rows.append({"workers": workers, "threads": 1, "cpus": 4, "model": "small", "batch": 10,
                             "policy": policy, "trial": trial, "trial_status": "ok", "n": 50,
                             "p99": [0.030, 0.020, 0.032][trial] * (1.05 if policy == "cfs" else 1),
                             "migrations_per_request": migrations[trial]})
    trials = pd.DataFrame(rows)
    speedups = pd.DataFrame({"policy": "tuna-scatter", "baseline": "cfs", "speedup": [1.05, 1.05],
                             "ci_low": [0.6, 0.7], "ci_high": [1.8, 1.6]})
    text = scope_sentence(trials, speedups)
    assert text.startswith("2-3 trials x 50 requests per policy and application (2 applications) on 4 CPUs: ")
    assert "enough to separate migrations per request from cfs's (" in text
    assert "too few to separate p99s closer than 51%" in text             # sqrt(1.6 / 0.7) = 1.51


# -- the verdict in words ---------------------------------------------------------------------------------


def test_run_says_in_words_that_no_policy_differed_when_every_interval_holds_1(cell):
    requests, trials = cell
    s = summarize(requests, trials)
    assert ((s.speedups["ci_low"] < 1) & (s.speedups["ci_high"] > 1)).all()
    assert s.verdict == "No policy's p99 differed from cfs's: both intervals hold 1."
    assert s.verdict == verdict_text(s.speedups, "cfs")              # the one helper, not a second wording
    assert s.to_dict()["verdict"] == s.verdict                          # run --json has it too


def test_a_policy_whose_interval_clears_1_is_named_faster(cell):
    requests, trials = cell
    # tuna-scatter's requests twice as fast, trial by trial: its interval now lies above 1.
    faster = requests["policy"].eq("tuna-scatter")
    quick = requests.assign(server_seconds=requests["server_seconds"].where(~faster, requests["server_seconds"] / 4))
    quick_trials = trials.assign(p99=trials["p99"].where(trials["policy"].ne("tuna-scatter"), trials["p99"] / 4))
    s = summarize(quick, quick_trials)
    row = s.speedups.set_index("policy").loc["tuna-scatter"]
    assert row["ci_low"] > 1
    assert s.verdict.startswith(f"tuna-scatter faster than cfs: {row['speedup']:.2f}x "
                                f"{format_interval(row['ci_low'], row['ci_high'])}")
    assert "No policy's p99 differed" not in s.verdict


def test_the_stored_oversubscribed_cell_names_both_pinned_policies_faster_with_the_waiting_that_moved():
    # Measured, not made: 2 x 2 on a quiet machine (notebook 10 leads with it).
    requests, trials, _ = load_results(OVER)
    s = summarize(requests, trials)
    assert (s.speedups["ci_low"] > 1).all() and len(s.speedups) == 2
    assert s.verdict == verdict_text(s.speedups, "cfs")
    assert s.verdict.startswith("round-robin faster than cfs: 1.24x [1.15, 1.33]; tuna-scatter faster than cfs: ")
    assert "enough to separate p99 in 2 of 2 comparisons" in s.scope
    assert "enough to separate run-queue wait per request from cfs's (2 of 2 policies)" in s.scope


# -- the report: verdict first, one row per cell, "default", grammar -----------------------------------------


def test_the_report_of_one_cell_says_its_verdict_and_shows_each_speedup_once(cell, tmp_path):
    requests, trials = cell
    page = _text(write_report(requests, trials, tmp_path / "r.html"))
    assert "1 application on 2 logical cores; 5 valid trials per policy and application." in page
    assert "1 applications" not in page and "3-3 valid" not in page
    said = page.split("<strong>What these results can tell.</strong> ", 1)[1].split("</p>", 1)[0]
    scope = scope_sentence(trials, verdict_table(scenario_stats(trial_stats(requests, trials))))
    assert said.startswith(scope) and "No policy's p99 differed from cfs's: both intervals hold 1." in said
    # The verdict comes before the first table.
    assert page.index("What these results can tell.") < page.index("<table")
    # One cell's speedup once: not five rows "(n=1)", nor a table of averages repeating the comparisons' speedups
    assert "Average speedup over" not in page and "(n=1)" not in page
    assert "With one application, these speedups are also the averages over applications" in page
    compared = _section_rows(page, "Policy comparisons")
    assert [r[:3] for r in compared] == [["round-robin", "cfs", "1"], ["tuna-scatter", "cfs", "1"],
                                         ["tuna-scatter", "round-robin", "1"]]
    # The first words after the header are what the trials can tell, before the counts of what ran.
    assert page.index("What these results can tell.") < page.index("1 application on 2 logical cores")
    # Every table says "default" for an unset spin count: none says -1.
    heads = re.findall(r"<thead>(.*?)</thead>\s*<tbody>(.*?)</tbody>", page, flags=re.DOTALL)
    spins = 0
    for head, body in heads:
        names = [re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", head, re.DOTALL)]
        if "spincount" in names:
            at = names.index("spincount")
            for row in re.findall(r"<tr>(.*?)</tr>", body, flags=re.DOTALL):
                cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", row, re.DOTALL)]
                assert cells[at] == "default", (names, cells)
                spins += 1
        assert "wait_policy" not in names                               # one spelling: "wait policy"
    assert spins >= 4                                                   # scenarios, CPU, evidence, relations


def test_the_locality_table_names_each_worker_by_its_number_and_the_master_by_its_role(cell, tmp_path):
    from tuna_lab.measure.store import load_thread_cpu

    requests, trials = cell
    page = _text(write_report(requests, trials, tmp_path / "r.html", threads=load_thread_cpu(CELL)))
    rows = _section_rows(page, "NUMA locality per worker")
    # before: slots "0.0", "1.0" and "-" (the gunicorn master, which has none)
    assert sorted({r[2] for r in rows}) == ["0", "1", "master"], rows
    assert all(r[5] == "-" for r in rows if r[2] == "master")        # the master serves no request: no p99


def test_a_grouping_with_several_values_keeps_its_rows_and_counts_read_as_ranges(tmp_path):
    from test_analysis import make_tables

    requests, trials = make_tables()            # 2 models x 4 configurations; cfs at 4x8 medium lost a trial
    page = _text(write_report(requests, trials, tmp_path / "r.html"))
    rows = _section_rows(page, "Average speedup over cfs")
    groupings = [r[0] for r in rows]
    assert groupings.count("all") == 1 and groupings.count("model") == 2 and groupings.count("subscription") == 2
    assert len({tuple(r[:2]) for r in rows}) == len(rows)                # no row twice
    assert "8 applications on 16 logical cores; 2-3 valid trials per policy and application." in page
    # two averages of one speedup, said apart: the ratio of average p99s, and the article's average of speedups
    assert "the two may differ, even in direction" in page.split("<h2>Policy comparisons</h2>", 1)[1]


def test_the_evidence_of_several_applications_heads_each_with_default_not_minus_one():
    from tuna_lab.analysis.mechanism import mechanism_lines, mechanism_table

    trials = pd.concat([load_results(DATA / "sched-2cpu" / cell)[1] for cell in (CELL.name, OVER.name)])
    heads = [line for line in mechanism_lines(mechanism_table(trials)) if line.startswith("  workers=")]
    # before: "..., wait_policy=default, spincount=-1:" beside tables that say "default"
    assert len(heads) == 2 and all(h.endswith("wait_policy=default, spincount=default:") for h in heads), heads


def test_the_verdict_counts_in_words_one_speedup_or_many():
    one = pd.DataFrame({"baseline": "cfs", "policy": ["tuna-scatter"], "speedup": [1.1], "ci_low": [0.8],
                        "ci_high": [1.5]})
    # not "all 1 speedup intervals hold 1"
    assert verdict_text(one) == "No policy's p99 differed from cfs's: its interval holds 1."
    few = one.assign(ci_low=np.nan, ci_high=np.nan)
    assert verdict_text(few).endswith("(fewer than 3 trials of a policy) in the one speedup.")
    assert verdict_text(pd.concat([few] * 3)).endswith("in all 3 speedups.")                # was "in all 3."


def test_shown_defaults_writes_default_for_every_unset_wait_setting():
    table = pd.DataFrame({"wait_policy": ["passive", None, "default"], "spincount": [1000, -1, np.nan]})
    shown = shown_defaults(table)
    assert shown.columns.tolist() == ["wait policy", "spincount"]
    assert shown.values.tolist() == [["passive", "1000"], ["default", "default"], ["default", "default"]]
    assert table["spincount"].tolist()[:2] == [1000, -1]                 # the stored table is left as it was


# -- the demo: plain words and where to go next ----------------------------------------------------------------


def test_the_demo_says_its_mappings_in_words_and_where_to_go_next():
    from helpers import main

    p = main("demo", "--offline", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    for jargon in ("step=", "scenario 2", "certificate", " L=", " r=", "proven_optimal", "Topology("):
        assert jargon not in p.stdout, jargon
    # The article's machine: the same words on every machine that runs this.
    assert "scatter (each worker's threads spread apart): 4 workers x 8 threads on 32 CPUs, 1 thread on every CPU" \
        in p.stdout
    assert re.search(r"score -?\d+ = \d+ for main threads far apart [+-] \d+ for the distance between each "
                     r"worker's threads \((scatter rewards it|compact counts it against)\)", p.stdout)
    assert "every constraint of the model, checked on this mapping: holds" in p.stdout
    # What it can tell comes first, before any mapping
    assert p.stdout.splitlines()[0] == ("What this demo can tell: the Tuna mapping of this machine and of the "
                                        "article's (--offline: nothing is measured).")
    tail = p.stdout.rstrip().splitlines()[-3:]
    assert tail[0] == "Where to go next:"
    assert "`make lab`" in tail[1] and "notebooks/01_topology_and_distances.ipynb" in tail[1]
    assert (Path(__file__).resolve().parent.parent / "notebooks" / "01_topology_and_distances.ipynb").is_file()


def test_the_demos_first_sentence_says_what_its_size_can_tell():
    from tuna_lab.analysis.summary import demo_opening

    three = demo_opening(2, 3, 200)
    # Few CPUs: it leads with what the design separates (migrations) and says p99 may not separate the policies,
    # not "enough for an interval, which says whether a policy differed" (the 2-CPU demo's was [0.40, 3.34]).
    assert "3 trials x 200 requests each - enough for an interval on migrations per request" in three
    assert "On 2 CPUs every placement keeps every CPU busy, so p99 may not separate the policies" in three
    assert "whether a policy differed" not in three
    big = demo_opening(32, 3, 200)
    assert "migrations per request" in big and "and on p99" in big and "may not separate" not in big
    two = demo_opening(32, 2, 1)
    assert "2 trials x 1 request each - too few trials for an interval (it takes 3), so no verdict" in two
    assert "article's speedups" not in two                          # 32 CPUs: the article's scale
    assert "On 1 CPU every" in demo_opening(1, 3, 200)


@pytest.mark.parametrize("bad, said", [
    (["--trials", "0"], "trials must be a positive integer, got 0"),
    (["--requests", "-1"], "requests must be a positive integer, got -1"),
    (["--out", "/proc/tuna-lab-demo"], "--out /proc/tuna-lab-demo: cannot create"),
])
def test_the_demo_refuses_bad_input_before_it_prints_anything(bad, said):
    # Once: the 36 lines of the offline phase on stdout, then the error (and the opening promised -1 requests).
    from helpers import main

    p = main("demo", *bad, timeout=60)
    assert p.returncode == 2 and p.stdout == "", p.stdout[:500]
    assert said in p.stderr


def test_the_demo_says_why_scatter_and_compact_are_one_mapping():
    # On 2 CPUs (or any machine whose cores are all equally far apart) the two mappings print alike: say why,
    # in the ModeExplorer's words (model.modes.difference), not a second copy of them.
    from tuna_lab.cli.commands.run import _modes_alike
    from tuna_lab.machine.topology import Topology
    from tuna_lab.model import solve
    from tuna_lab.model.modes import difference

    s, c = (solve(4, 8, "xeon-8272cl", m, time_limit=30) for m in ("scatter", "compact"))
    assert _modes_alike(s, c) is None                                   # they differ: nothing to explain
    two = Topology.preset("xeon-8272cl").restrict([0, 1])               # the demo's 2 CPUs: 2 x 2 alike
    s, c = (solve(2, 2, two, m, time_limit=30) for m in ("scatter", "compact"))
    line = _modes_alike(s, c)
    assert line == f"  why scatter and compact are one mapping here: {difference(s, c)}"
    assert "equally far apart" in line


def test_the_demo_names_the_report_and_the_command_that_writes_it_again():
    from tuna_lab.cli.commands.run import _next_steps

    lines = _next_steps("results/demo/report.html", "results/demo").splitlines()
    assert lines[1] == "Where to go next:"
    assert ("open results/demo/report.html in a browser; `tuna-lab report results/demo -o results/demo/report.html`"
            in lines[2])
    assert any("`make lab`" in line and "notebook 01" in line for line in lines)


def test_runs_cpu_columns_are_said_in_words(cell):
    requests, trials = cell
    lines = summarize(requests, trials).to_text().splitlines()
    assert "front CPU ms/req" in lines[0]
    legend = lines[4]
    assert legend.startswith("(CPU ms/req: CPU time per request - server: the workers' threads; front: the "
                             "master's, its helpers' and front ends'")


def test_a_report_of_trials_that_all_failed_says_so_instead_of_failing(cell, tmp_path):
    """A loaded machine's demo (every trial over its error budget) once ended 'mechanism table table is empty'."""
    requests, trials = cell
    failed = trials.assign(trial_status="failed", reason="2 of 50 requests failed (4.0%, more than the 1.0% allowed)")
    page = _text(write_report(requests, failed, tmp_path / "r.html"))
    assert "<strong>What these results can tell.</strong> Nothing: no trial is valid" in page
    assert "0 valid trials per policy and application" in page
    assert "No valid trial, so no scheduler evidence to show" in page
    assert page.count("more than the 1.0% allowed") == len(trials)        # each failed trial, with its reason
