"""Validity per policy, and records that cannot be read or written: one clear line, never a traceback.

A cell is finished only when every policy it promised has its valid trials;
a resume keeps the valid (trial, policy) runs and redoes only the others. A
manifest that is corrupt (bad counts, too deep, not JSON) makes the cell
unfinished for a resume and is refused by every reader with one line. A
number a record cannot hold is refused before any trial runs; a cell that
cannot be written leaves no temporary folder, whatever the error.
"""

import json
import os

import pandas as pd
import pytest

from helpers import main
from tuna_lab.errors import ExperimentError, StoreError
from tuna_lab.measure.experiment import Config, LoadSpec, Result, TrialSpec, load_results, run
from tuna_lab.measure.store import cell_state, is_finished, lock_folder, no_valid_trial, write_cell
from tuna_lab.measure.sweeps.local import sweep
from tuna_lab.server.models import ensure_model

# alone: it measures latency (tests/conftest.py)
pytestmark = pytest.mark.alone

POLICIES = ["cfs", "round-robin"]


def _result(statuses, trials=2, replaced=None):
    """A Result of ``trials`` trials of both POLICIES; ``statuses`` per (policy, trial) in that order."""
    rows = [{"policy": p, "trial": t, "order": i, "trial_status": statuses[k], "p99": 0.1,
             "workers_replaced": (replaced or [0] * len(statuses))[k], "master_restarted": 0}
            for k, (i, p, t) in enumerate((i, p, t) for t in range(trials) for i, p in enumerate(POLICIES))]
    return Result(pd.DataFrame({"status": [200]}), pd.DataFrame(rows),
                  {"cell": "w1-t1-small-b10", "policies": POLICIES, "trials": trials})


def test_a_cell_is_finished_only_when_every_policy_has_its_valid_trials(tmp_path):
    cell = str(tmp_path / "w1-t1-small-b10")
    # The case: 3 valid trials in all, but cfs has 1 of its 2.
    write_cell(cell, _result(["ok", "ok", "failed", "ok"]))
    manifest = json.load(open(os.path.join(cell, "manifest.json")))
    assert manifest["valid_trials"] == 3 and manifest["valid_by_policy"] == {"cfs": 1, "round-robin": 2}
    state = cell_state(cell)
    assert not is_finished(cell) and state.status == "incomplete" and state.missing == {"cfs": 1}
    assert state.reason == "cfs has 1 of its 2 valid trials" and state.readable
    # Readers still read its valid trials; no policy lacks every trial.
    assert len(load_results(cell)[1]) == 4 and no_valid_trial(cell) == {}
    # A trial during which a worker was replaced does not count, even if its status were ok.
    write_cell(cell, _result(["ok"] * 4, replaced=[0, 1, 0, 0]))
    assert cell_state(cell).missing == {"round-robin": 1}
    write_cell(cell, _result(["ok", "failed", "ok", "failed"]))
    assert no_valid_trial(cell) == {cell: ["round-robin"]}
    assert no_valid_trial(str(tmp_path)) == {cell: ["round-robin"]}
    assert no_valid_trial(_result(["ok", "failed", "ok", "failed"])) == {"w1-t1-small-b10": ["round-robin"]}
    write_cell(cell, _result(["ok"] * 4))
    assert is_finished(cell) and cell_state(cell).reason == ""


@pytest.mark.parametrize("text, why", [
    ('{"valid_trials": "abc"}', "valid_trials is 'abc', not a count"),
    ('{"valid_trials": null}', "valid_trials is None, not a count"),
    ('{"policies": ["cfs"], "trials": 2, "valid_by_policy": {"cfs": "x"}}', "not a count per policy"),
    ('[1, 2]', "holds a JSON list"),
    ('{"a": ', "is not JSON"),
    ('[' * 100_000 + ']' * 100_000, "nests deeper than"),
])
def test_a_corrupt_manifest_is_not_finished_and_every_reader_says_so_in_one_line(tmp_path, text, why):
    cell = tmp_path / "sweep" / "w1-t1-small-b10"
    write_cell(str(cell), _result(["ok"] * 4))
    (cell / "manifest.json").write_text(text)
    state = cell_state(str(cell))
    assert state.status == "corrupt" and why in state.reason and not is_finished(str(cell))
    for read in (load_results, no_valid_trial):
        with pytest.raises(ExperimentError, match="not a readable tuna-lab result") as info:
            read(str(tmp_path / "sweep"))
        assert why in str(info.value) and "\n" not in str(info.value)
    for command in (["report", str(tmp_path / "sweep")],
                    ["advise", str(tmp_path / "sweep"), "-w", "1", "-t", "1", "--model", "small"]):
        p = main(*command)
        # 1: the cell is named as unreadable and left out of nothing (issue 46: report and advise exit non-zero)
        assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "Traceback" not in p.stderr and why in p.stderr


def test_a_record_that_cannot_be_written_leaves_no_temporary_folder(tmp_path):
    cell = tmp_path / "c"
    bad = _result(["ok"] * 4)
    bad.trials["spincount"] = [10**30] * 4          # an object column pyarrow cannot store as a number
    bad.trials["spincount"] = bad.trials["spincount"].astype(object)
    with pytest.raises(StoreError, match="could not write") as info:
        write_cell(str(cell), bad)
    assert "\n" not in str(info.value) and os.listdir(tmp_path) == []
    # Over an existing cell: it stays as it was.
    write_cell(str(cell), _result(["ok"] * 4))
    before = (cell / "manifest.json").read_bytes()
    with pytest.raises(StoreError):
        write_cell(str(cell), bad)
    assert (cell / "manifest.json").read_bytes() == before and os.listdir(tmp_path) == ["c"]


def test_a_number_no_record_can_hold_is_refused_before_any_trial(tmp_path):
    with pytest.raises(ExperimentError, match="spincount must be at most 9223372036854775807") as info:
        Config(1, 1, "small", 10, spincount=10**30)
    assert "\n" not in str(info.value)
    p = main("run", "-w", "1", "-t", "1", "--model", "small", "--policies", "cfs", "--trials", "1",
             "--requests", "5", "--spincount", 10**30, "--out", tmp_path / "c")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "spincount" in p.stderr, p.stderr
    assert not (tmp_path / "c").exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("plant", ["symlink", "fifo"])
def test_a_results_folder_lock_that_is_no_file_is_refused_in_one_line(tmp_path, plant):
    folder = tmp_path / "results"
    folder.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    if plant == "symlink":
        (folder / ".tuna-lab.lock").symlink_to(victim)
    else:
        os.mkfifo(folder / ".tuna-lab.lock")
    with pytest.raises(ExperimentError, match=r"lock file .* (is a symbolic link|\(a FIFO\))") as info:
        with lock_folder(str(folder)):
            pass
    assert "\n" not in str(info.value) and victim.read_text() == "keep me"


def test_sweep_and_run_json_files_are_read_safely(tmp_path):
    from tuna_lab.measure.store import read_sweep_file
    from tuna_lab.measure.tune.tuner import read_tune
    from tuna_lab.errors import TuneError

    (tmp_path / "sweep.json").write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(ExperimentError, match="nests deeper than") as info:
        read_sweep_file(str(tmp_path))
    assert "\n" not in str(info.value)
    (tmp_path / "tune.json").symlink_to("/dev/zero")
    with pytest.raises(TuneError, match="symbolic link"):
        read_tune(str(tmp_path))


@pytest.fixture(scope="module")
def small_model():
    ensure_model("small")


def test_a_resume_keeps_the_valid_runs_and_redoes_only_the_missing_ones(tmp_path, small_model):
    out = tmp_path / "w1-t1-small-b10"
    config = Config(1, 1, "small", 10)
    first = run(config, POLICIES, trials=2, load=LoadSpec(20), out=str(out), trial=TrialSpec(seed=5))
    assert len(first.trials) == 4 and is_finished(str(out))
    # One run made invalid on disk, as a killed worker leaves it: the cell is one run short.
    trials = first.trials.copy()
    hit = trials.index[(trials["policy"] == "cfs") & (trials["trial"] == 1)][0]
    trials.loc[hit, ["trial_status", "workers_replaced"]] = ["failed", 1]
    write_cell(str(out), Result(first.requests, trials, first.manifest, threads=first.threads))
    assert cell_state(str(out)).missing == {"cfs": 1}
    lines = []
    again = run(config, POLICIES, trials=2, load=LoadSpec(20), out=str(out), trial=TrialSpec(seed=5),
                progress=lines.append)
    assert any("keeping 3 valid runs of an earlier attempt, running the 1 missing" in line for line in lines)
    assert sum(" trial " in line for line in lines) == 1                       # one run measured, no more
    redone = again.trials.set_index(["trial", "policy"])
    assert redone["attempt"].to_dict() == {(0, "cfs"): 0, (0, "round-robin"): 0, (1, "cfs"): 1,
                                           (1, "round-robin"): 0}
    kept = first.trials.set_index(["trial", "policy"]).drop(index=(1, "cfs"))
    assert (redone.loc[kept.index, "p99"] == kept["p99"]).all()              # the kept runs, untouched
    assert (redone["trial_status"] == "ok").all() and is_finished(str(out))
    manifest = json.load(open(out / "manifest.json"))
    assert manifest["attempts"] == 2 and manifest["kept_runs"] == 3
    assert manifest["valid_by_policy"] == {"cfs": 2, "round-robin": 2}
    requests = load_results(str(out))[0]
    assert len(requests) == 4 * 20 and not requests.duplicated(["trial", "policy", "request"]).any()
    # A finished cell run again is measured anew, not resumed.
    lines.clear()
    run(config, ["cfs"], trials=1, load=LoadSpec(20), out=str(out), trial=TrialSpec(seed=5), progress=lines.append)
    assert not any("keeping" in line for line in lines)


def test_a_sweep_over_a_corrupt_cell_redoes_it_and_says_so(tmp_path, small_model):
    out = tmp_path / "sweep"
    configs = [Config(1, 1, "small", 10)]
    sweep(configs, ["cfs"], str(out), trials=1, requests=20)
    (out / configs[0].key / "manifest.json").write_text('{"valid_trials": "abc"}')
    lines = []
    sweep(configs, ["cfs"], str(out), trials=1, requests=20, progress=lines.append)
    assert "0 of 1 cells already finished" in lines[0]
    assert any("is redone whole" in line and "valid_trials is 'abc'" in line for line in lines)
    assert is_finished(str(out / configs[0].key)) and len(load_results(str(out))[1]) == 1


# -- one definition of a valid trial (issue 48), every worker measured (issue 47) ---------------------------

def _every_kind():
    """A trials table with one row of each kind of invalid trial, and two valid ones."""
    return pd.DataFrame({
        "policy": ["cfs", "cfs", "cfs", "cfs", "round-robin", "round-robin", "round-robin"],
        "trial": [0, 1, 2, 3, 0, 1, 2],
        "trial_status": ["ok", "failed", "ok", "ok", "ok", "ok", "ok"],
        "reason": ["", "timeouts", "", "", "", "", ""],
        "p50": 0.05, "p99": [0.1, None, 0.1, 0.1, None, 0.1, 0.1],
        "workers_replaced": [0, 0, 1, 0, 0, 0, 0], "master_restarted": 0,
        # 0.05: a worker left out of the load (written "ok" by hand here: the rule, not the status, decides)
        "worker_share": [0.9, 0.9, 0.9, 0.05, 0.9, 1.0, float("nan")]})


def test_every_reader_counts_the_same_valid_trials():
    from tuna_lab.analysis.tables import valid_trials as analysis_valid
    from tuna_lab.measure.store import valid_by_policy, valid_rows

    table = _every_kind()
    expected = [True, False, False, False, False, True, True]
    assert valid_rows(table).tolist() == expected
    assert analysis_valid(table).tolist() == expected
    assert valid_by_policy(table, POLICIES) == {"cfs": 1, "round-robin": 2}


def test_a_trial_that_left_a_worker_out_is_not_counted_and_is_counted_apart():
    from tuna_lab.analysis.summary import summarize

    table = _every_kind().iloc[[0, 3, 5]]
    summary = summarize(None, table)
    assert summary.summary.set_index("policy")["trials"].to_dict() == {"cfs": 1, "round-robin": 1}
    assert any(line.startswith("note: 1 of 3 trials left a worker out of the load") for line in summary.notes)
    # A cell whose only trials left a worker out has no valid trial: run and sweep exit 1 for it.
    result = Result(pd.DataFrame({"status": [200]}), table.iloc[[1]],
                    {"cell": "w2-t1-app", "policies": ["cfs"], "trials": 1})
    assert no_valid_trial(result) == {"w2-t1-app": ["cfs"]}


def test_worker_balance_reads_requests_where_the_server_names_the_worker_else_cpu():
    from tuna_lab.measure.cpu import worker_balance

    threads = pd.DataFrame({"pid": [10, 10, 11, 1], "role": ["main", "pool", "main", "master"],
                            "cpu_seconds": [1.5, 0.5, 0.01, 3.0]})
    anonymous = pd.DataFrame({"status": [200, 200], "pid": [-1, -1]})
    assert worker_balance(threads, anonymous, [10, 11]) == (0.005, 11, "cpu")
    # A worker with no row at all did none of the load; the master's CPU is no worker's.
    assert worker_balance(threads, anonymous, [10, 11, 12]) == (0.0, 12, "cpu")
    named = pd.DataFrame({"status": [200, 200, 200, 500], "pid": [10, 11, 11, 10]})
    assert worker_balance(threads, named, [10, 11]) == (0.5, 10, "requests")
    assert worker_balance(None, anonymous, [10]) == (1.0, 10, "requests")
    share, least, by = worker_balance(None, anonymous, [10, 11])
    assert least is None and by == "" and share != share          # not measured: NaN, judged by nothing


def test_the_report_counts_trials_that_left_a_worker_out_apart(tmp_path):
    from tuna_lab.analysis.report import write_report

    requests, trials, _ = load_results("notebooks/data/sweep-2cpu/w2-t1-small-b100")     # one cell of 15 trials
    trials = trials.assign(worker_share=1.0)
    first = trials.index[0]
    trials.loc[first, ["trial_status", "reason", "worker_share"]] = ["failed", "a worker left out of the load", 0.05]
    html = open(write_report(requests, trials, str(tmp_path / "r.html"), title="t")).read()
    assert f"note: 1 of {len(trials)} trials left a worker out of the load" in html


@pytest.mark.parametrize("row, again", [
    ({"trial_status": "failed", "worker_share": 0.1, "workers_replaced": 0, "master_restarted": 0}, True),
    ({"trial_status": "ok", "worker_share": 0.9, "workers_replaced": 0, "master_restarted": 0}, False),
    # a worker replaced, or the master restarted, is a fault of the server: never sent again
    ({"trial_status": "failed", "worker_share": 0.1, "workers_replaced": 1, "master_restarted": 0}, False),
    ({"trial_status": "failed", "worker_share": 0.1, "workers_replaced": 0, "master_restarted": 1}, False),
    # failed otherwise (errors), every worker reached: not the connections' draw
    ({"trial_status": "failed", "worker_share": 0.8, "workers_replaced": 0, "master_restarted": 0}, False),
    ({"trial_status": "failed", "worker_share": float("nan"), "workers_replaced": 0, "master_restarted": 0}, False),
])
def test_only_a_load_that_left_a_worker_out_is_sent_again(row, again):
    from tuna_lab.measure.trials import _left_out

    assert _left_out(row) is again


def test_a_load_sent_again_is_said_in_the_progress_line():
    import time

    from tuna_lab.measure.experiment import _progress_line

    row = {"cell": "w2-t1-app", "trial": 0, "policy": "cfs", "p50": 0.01, "p99": 0.02, "trial_status": "ok",
           "reason": "", "cpu_per_request": float("nan"), "generator_cpu_per_request": float("nan"),
           "reloads": 1, "reload_reason": "a worker left out of the load: worker 7 did 3%"}
    plan = type("Plan", (), {"orders": [("cfs",)]})()
    line = _progress_line(plan, row, 1, 1, time.monotonic())
    assert "ok (its load was sent again 1x on fresh connections; the first: a worker left out" in line
    assert "sent again" not in _progress_line(plan, {**row, "reloads": 0}, 1, 1, time.monotonic())
