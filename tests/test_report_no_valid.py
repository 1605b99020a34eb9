"""``report`` names every cell it leaves out for having no valid trial (issue 46: nothing dropped without a word).

Built from stored data, no server: tests/data/tune-loaded (the 4-minute tune notebook 09
read until it was re-measured, made while a test run loaded the machine) holds a real cell,
w1-t2-medium-b100, whose 6 trials all failed (too many requests timed out);
its manifest counts no valid trial, so the readers pass over it. Another
cell's trials are marked failed by hand (a manifest that still counts them
valid): the report finds that one in the trials it read.
"""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from helpers import main

TUNE = Path(__file__).parent / "data" / "tune-loaded"
FAILED = "w1-t2-medium-b100"
FIRST = "11 of 28 requests failed (39.3%, more than the 1.0% allowed): timeout"


@pytest.fixture
def results(tmp_path):
    folder = tmp_path / "tune"
    shutil.copytree(TUNE, folder)
    return folder


def _fail(cell, reason):
    """Mark every trial of ``cell`` failed with ``reason``, as a run whose every trial failed writes them."""
    trials = pd.read_parquet(cell / "trials.parquet")
    trials.assign(trial_status="failed", reason=reason, p99=float("nan")).to_parquet(cell / "trials.parquet")


def test_report_names_each_cell_without_a_valid_trial_on_stderr_in_json_and_in_the_report(results, tmp_path):
    _fail(results / "w2-t1-medium-b100", "server did not start: port in use")
    out = tmp_path / "r.html"
    p = main("report", results, "-o", out, "--json", timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert lines == [
        f"tuna-lab: warning: {FAILED} has no valid trial and is left out of the report: all 6 trials failed; "
        f"the first: {FIRST}",
        "tuna-lab: warning: w2-t1-medium-b100 has no valid trial and is left out of the report: all 7 trials "
        "failed; the first: server did not start: port in use",
        # stored as measured: every cfs trial of w2-t2 timed out, so its speedups have no baseline
        "tuna-lab: warning: w2-t2-medium-b100 (cfs) has no valid trial and is left out of the report: all 2 "
        "trials failed; the first: 7 of 28 requests failed (25.0%, more than the 1.0% allowed): timeout"], p.stderr
    assert set(json.loads(p.stdout)["no_valid_trial"]) == {FAILED, "w2-t1-medium-b100", "w2-t2-medium-b100 (cfs)"}
    assert "anatomy" in json.loads(p.stdout)        # docs/anatomy.md and docs/cli.md name it
    html = out.read_text()
    assert "2 cells and 1 policy of a cell have no valid trial and are left out of every figure" in html
    assert f"<code>{FAILED}</code>: all 6 trials failed; the first: {FIRST}" in html


@pytest.mark.parametrize("where", ["sweep", "cell", "read"])
def test_report_without_one_valid_trial_exits_1_in_one_line_and_writes_nothing(results, tmp_path, where):
    only = tmp_path / "only"
    only.mkdir()
    if where == "read":     # read (its manifest counts valid trials), but its trials say otherwise
        shutil.copytree(results / "w2-t1-medium-b100", only / "w2-t1-medium-b100")
        _fail(only / "w2-t1-medium-b100", "server did not start: port in use")
    else:
        shutil.copytree(results / FAILED, only / FAILED)
    target = only / FAILED if where == "cell" else only
    p = main("report", target, "-o", tmp_path / "r.html", timeout=120)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 1 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"tuna-lab: error: no cell under {target} has a valid trial")
    assert (FIRST if where != "read" else "port in use") in lines[0]
    assert not (tmp_path / "r.html").exists()


def test_advise_names_each_cell_without_a_valid_trial_it_learns_without(tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(Path(__file__).parent.parent / "notebooks" / "data" / "sweep-2cpu", sweep)
    _fail(sweep / "w2-t1-small-b100", "server did not start: port in use")
    n = len(pd.read_parquet(sweep / "w2-t1-small-b100" / "trials.parquet"))
    p = main("advise", "-w", "2", "-t", "2", "--model", "small", sweep, "--json", timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert lines == ["tuna-lab: warning: w2-t1-small-b100 has no valid trial and is left out of what advise "
                     f"learns from: all {n} trials failed; the first: server did not start: port in use"], p.stderr
    assert json.loads(p.stdout)["no_valid_trial"] == {
        "w2-t1-small-b100": f"all {n} trials failed; the first: server did not start: port in use"}


def test_report_names_a_policy_with_no_valid_trial_in_a_cell_whose_others_have_some(results, tmp_path):
    cell = results / "w2-t1-medium-b100"
    trials = pd.read_parquet(cell / "trials.parquet")
    policy = sorted(set(trials["policy"]) - {"cfs"})[0]
    mine = trials["policy"].eq(policy)
    trials.loc[mine, "trial_status"] = "failed"
    trials.loc[mine, "reason"] = "the server answered 500"
    trials.to_parquet(cell / "trials.parquet")
    p = main("report", results, "-o", tmp_path / "r.html", "--json", timeout=120)
    assert p.returncode == 0, p.stderr
    name = f"w2-t1-medium-b100 ({policy})"
    assert (f"tuna-lab: warning: {name} has no valid trial and is left out of the report: all {int(mine.sum())} "
            "trials failed; the first: the server answered 500") in p.stderr.splitlines()
    assert name in json.loads(p.stdout)["no_valid_trial"]
    assert f"<code>{name}</code>" in (tmp_path / "r.html").read_text()


def test_a_planted_reason_reaches_the_terminal_as_one_short_line_without_escapes(results, tmp_path):
    # A trials file is another user's to write: its reason may hold terminal escapes, line breaks, a megabyte.
    _fail(results / "w2-t1-medium-b100", "port\x1b[2J\r\nin use " + "x" * 100_000)
    p = main("report", results, "-o", tmp_path / "r.html", "--json", timeout=120)
    assert p.returncode == 0, p.stderr
    warned = [line for line in p.stderr.splitlines() if "w2-t1-medium-b100" in line]
    assert len(warned) == 1 and "\x1b" not in p.stderr and "\r" not in p.stderr and len(warned[0]) < 600
    assert "the first: port?[2J? in use xxx" in warned[0] and warned[0].endswith("...")
