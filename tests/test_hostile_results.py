"""Results never replaced or dropped without a word, and no figure from nothing (issue 46).

Every case builds its results folder on disk (a copy of the stored sweep
notebooks/data/sweep-2cpu, or a sweep or tune folder made by hand) and runs
the real CLI in this process: each must give one line on stderr, the right
exit status (2: refused before anything ran; 1: results that cannot be read),
no traceback, and leave every measurement as it was.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import main, simulated_race
from tuna_lab.errors import ExperimentError, TuneError
from tuna_lab.measure.claims import check_claim
from tuna_lab.measure.store import SWEEP_FILE, load_results, write_sweep_file
from tuna_lab.measure.tune.race import MIN_STEP_SECONDS, Candidate, RaceRules, race
from tuna_lab.measure.tune.records import TuneRecords, step_of

SWEEP = Path(__file__).parent.parent / "notebooks" / "data" / "sweep-2cpu"
CELL = "w2-t2-small-b100"


def _digest(folder):
    """Every file under ``folder`` and its bytes' hash: what "nothing lost" compares."""
    out = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and not path.is_symlink() and path.name != ".tuna-lab.lock":
            out[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _refused(result, code=2):
    """Exit ``code``, one line on stderr starting ``tuna-lab:``, nothing on it of a traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, (result.returncode, result.stderr[-800:])
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith("tuna-lab: error:"), result.stderr
    return lines[0]


#: The cells of the stored sweep a test copies: three of its ten, so that every report of them takes a second.
KEPT = ("w1-t2-small-b100", "w2-t1-small-b100", CELL)


@pytest.fixture
def sweep(tmp_path):
    """Three cells of the stored sweep, with the settings file a sweep writes today (naming those three)."""
    folder = tmp_path / "sweep"
    for cell in KEPT:
        shutil.copytree(SWEEP / cell, folder / cell)
    settings = json.loads((SWEEP / SWEEP_FILE).read_text())
    write_sweep_file(folder, {**settings, "configs": list(KEPT)})
    return folder


# -- report -o never replaces a measurement ---------------------------------------------------------------
@pytest.mark.parametrize("where", [f"{CELL}/trials.parquet", f"{CELL}/report.html", f"{CELL}.partial/x.html",
                                   "notes.txt", SWEEP_FILE])
def test_report_never_writes_over_a_measurement_or_a_file_of_another(sweep, where):
    (sweep / "notes.txt").write_text("my notes")
    (sweep / f"{CELL}.partial").mkdir()
    (sweep / f"{CELL}.partial" / "manifest.json").write_text("{}")
    before = _digest(sweep)
    line = _refused(main("report", sweep, "-o", sweep / where))
    assert "cell" in line or "no tuna-lab report" in line
    assert _digest(sweep) == before


def test_report_replaces_its_own_report(sweep, tmp_path):
    out = tmp_path / "r.html"
    assert main("report", sweep, "-o", out).returncode == 0
    assert main("report", sweep, "-o", out).returncode == 0
    assert 'name="generator" content="tuna-lab report"' in out.read_text()[:4096]


# -- report and advise name every cell they cannot read ----------------------------------------------------
def _spoil(cell, how):
    if how == "requests empty":
        (cell / "requests.parquet").write_bytes(b"")
    elif how == "requests missing":
        (cell / "requests.parquet").unlink()
    elif how == "requests fifo":
        (cell / "requests.parquet").unlink()
        os.mkfifo(cell / "requests.parquet")
    elif how == "trials folder":
        (cell / "trials.parquet").unlink()
        (cell / "trials.parquet").mkdir()
    elif how == "policy integer":
        trials = pd.read_parquet(cell / "trials.parquet")
        trials.assign(policy=range(len(trials))).to_parquet(cell / "trials.parquet")


HOWS = ["requests empty", "requests missing", "requests fifo", "trials folder", "policy integer"]


@pytest.mark.parametrize("how", HOWS)
def test_report_names_a_cell_it_cannot_read_and_exits_1(sweep, tmp_path, how):
    _spoil(sweep / CELL, how)
    line = _refused(main("report", sweep, "-o", tmp_path / "r.html", timeout=60), code=1)
    assert CELL in line and "--skip-unreadable" in line
    assert not (tmp_path / "r.html").exists()


def test_advise_names_a_cell_it_cannot_read_and_exits_1(sweep):
    _spoil(sweep / CELL, "requests fifo")
    _spoil(sweep / "w1-t2-small-b100", "trials folder")
    line = _refused(main("advise", "-w", "2", "-t", "2", "--model", "small", sweep, timeout=60), code=1)
    assert CELL in line and "w1-t2-small-b100" in line


def test_a_cell_reached_by_a_link_is_named_and_never_read_through_it(sweep, tmp_path):
    # Another user's folder linked into a shared results folder, at a cell's name and as a machine's folder.
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(sweep / CELL, elsewhere / "w9-t1-small-b100")
    (sweep / "w9-t1-small-b100").symlink_to(elsewhere / "w9-t1-small-b100")
    line = _refused(main("report", sweep, "-o", tmp_path / "r.html", timeout=60), code=1)
    assert "w9-t1-small-b100" in line and "is a link" in line and not (tmp_path / "r.html").exists()
    p = main("report", sweep, "-o", tmp_path / "r.html", "--json", "--skip-unreadable", timeout=60)
    assert p.returncode == 0 and "w9-t1-small-b100" in p.stderr, p.stderr
    assert "is a link" in json.loads(p.stdout)["left_out"]["w9-t1-small-b100"]
    # A link is named even where its target is no cell: nothing under the folder is passed over in silence.
    (sweep / "w9-t1-small-b100").unlink()
    (sweep / "machine-x").symlink_to(elsewhere)
    line = _refused(main("advise", "-w", "2", "-t", "2", "--model", "small", sweep, timeout=60), code=1)
    assert "machine-x" in line and "is a link" in line


def test_a_table_swapped_for_a_fifo_after_it_was_looked_at_is_refused_not_waited_on(sweep, monkeypatch):
    from tuna_lab.measure import readable

    # The lstat check passed (as for a name swapped between the look and the open): the open itself refuses.
    monkeypatch.setattr(readable, "table_file_problem", lambda path, required=True: None)
    (sweep / CELL / "trials.parquet").unlink()
    os.mkfifo(sweep / CELL / "trials.parquet")
    frame, why = readable.read_table(str(sweep / CELL / "trials.parquet"), "trials")
    assert frame is None and why == "trials.parquet is not a regular file (a FIFO); refusing to read it"
    (sweep / CELL / "trials.parquet").unlink()
    (sweep / CELL / "trials.parquet").symlink_to(sweep / CELL / "requests.parquet")
    frame, why = readable.read_table(str(sweep / CELL / "trials.parquet"), "trials")
    assert frame is None and why == "trials.parquet is a symbolic link"


def test_a_table_of_more_rows_than_a_cell_may_have_is_refused_before_it_is_read(sweep, monkeypatch):
    from tuna_lab.measure import readable

    rows = len(pd.read_parquet(sweep / CELL / "requests.parquet"))
    monkeypatch.setattr(readable, "MAX_TABLE_ROWS", rows - 1)
    frame, why = readable.read_table(str(sweep / CELL / "requests.parquet"), "requests")
    assert frame is None and why == f"requests.parquet holds {rows:,} rows, more than the {rows - 1:,} a cell's " \
                                    "table may have"


def test_skip_unreadable_goes_on_and_says_which_cells_were_left_out(sweep, tmp_path):
    _spoil(sweep / CELL, "requests empty")
    p = main("report", sweep, "-o", tmp_path / "r.html", "--json", "--skip-unreadable", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and CELL in p.stderr and "left out" in p.stderr
    assert json.loads(p.stdout)["left_out"] == {CELL: "requests.parquet is empty"}
    assert "1 cell could not be read and is left out" in (tmp_path / "r.html").read_text()
    assert json.loads(p.stdout)["cells"] == len(KEPT) - 1


# -- names checked before any work ------------------------------------------------------------------------
APP = 'def app(environ, start_response):\n    start_response("200 OK", [])\n    return [b"ok"]\n'


def test_a_label_too_long_for_a_file_name_is_refused_before_measuring(tmp_path):
    (tmp_path / "tiny.py").write_text(APP)
    p = main("run", "-w", "1", "-t", "1", "--app", "tiny:app", "--app-dir", tmp_path, "--label", "a" * 300,
             "--requests", "5", "--trials", "1", "--out", tmp_path / "r", timeout=60)
    line = _refused(p)
    assert "255" in line and "shorter label" in line
    assert not (tmp_path / "r").exists()


# -- a sweep's cells are the sweep's ----------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["run", "-w", "2", "-t", "2", "--model", "small", "--out", "{s}/" + CELL],       # inside its cell
    ["run", "-w", "2", "-t", "2", "--model", "small", "--out", "{s}/sub"],           # inside the sweep
    ["run", "-w", "2", "-t", "2", "--model", "small", "--trials", "3", "--out", "{s}"],  # other settings
    ["run", "-w", "2", "-t", "2", "--model", "small", "--trials", "2", "--requests", "100", "--out", "{s}"],
    ["tune", "--sla-p99", "1s", "--configs", "2x2", "--model", "small", "--budget", "1m", "--out", "{s}"],
    ["tune", "--sla-p99", "1s", "--configs", "2x2", "--model", "small", "--budget", "1m", "--out", "{s}/sub"],
])
def test_run_and_tune_never_replace_a_sweeps_cells(sweep, args):
    before = _digest(sweep)
    line = _refused(main(*[a.format(s=sweep) for a in args], timeout=60))
    assert "sweep" in line or "cell" in line
    assert _digest(sweep) == before and not (sweep / "sub").exists()


def test_a_cell_of_an_older_sweep_without_a_settings_file_is_not_replaced_by_run(tmp_path):
    folder = tmp_path / "old"
    shutil.copytree(SWEEP, folder)
    (folder / "sweep.json").unlink(missing_ok=True)     # as sweeps wrote before they kept their settings
    before = _digest(folder)
    line = _refused(main("run", "-w", "2", "-t", "2", "--model", "small", "--out", folder, timeout=60))
    assert "measured by `sweep`" in line
    tune = _refused(main("tune", "--sla-p99", "1s", "--configs", "1x1", "--budget", "1m", "--out", folder))
    assert "another command" in tune
    assert _digest(folder) == before


def test_a_folder_a_live_measurement_holds_covers_every_folder_inside_it(tmp_path):
    held = tmp_path / "sweep"
    held.mkdir()
    (held / ".tuna-lab.lock").write_text("")
    # Another process holds the sweep's folder, as a running sweep does (lock_folder's flock).
    child = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1]); "
                              "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                              str(held / ".tuna-lab.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(ExperimentError, match="in use by another measurement"):
            check_claim(str(held / "elsewhere"), "run", {"cell": "w1-t1-small-b10"})
    finally:
        child.kill()
        child.wait()
    check_claim(str(held / "elsewhere"), "run", {"cell": "w1-t1-small-b10"})     # released: allowed


# -- tune: no figure from nothing, and every step kept ------------------------------------------------------
@pytest.mark.parametrize("seconds", ["1e-9", "0.001", "0.049"])
def test_a_step_too_short_to_measure_is_refused_with_its_minimum(seconds, tmp_path):
    line = _refused(main("tune", "--sla-p99", "50ms", "--configs", "1x1", "--policies", "cfs", "--budget", "60s",
                         "--step-seconds", seconds, "--out", tmp_path / "t"))
    assert f"{MIN_STEP_SECONDS:g} s" in line
    assert not (tmp_path / "t").exists()


def test_a_step_that_sent_far_fewer_requests_than_its_rate_meets_nothing():
    frame = pd.DataFrame({"status": [200], "error": [""], "client_seconds": [0.001]})
    # One request "at" 100,000/s: what a 4 ns step sent. Never a pass at that rate.
    row = {"rate": 1e5, "step_duration": 0.05, "wall_seconds": 0.06, "reason": ""}
    assert not step_of(row, frame, 0.05, 0).passed
    fair = pd.DataFrame({"status": [200] * 20, "error": [""] * 20, "client_seconds": [0.001] * 20})
    assert step_of({**row, "rate": 10.0, "step_duration": 2.0, "wall_seconds": 2.1}, fair, 0.05, 0).passed


def _row(candidate, trial, rnd, step):
    """A tune's trial row of one simulated step, with the columns tune's records hold."""
    return {"cell": "w1-t1-small-b10", "policy": candidate.policy, "trial": trial, "trial_status": "ok",
            "workers": 1, "threads": 1, "model": "small", "batch": 10, "wait_policy": "default", "n": step.n,
            "rate": step.rate, "step_duration": step.duration, "round": rnd + 1, "step": 0,
            "candidate": candidate.name, "wall_seconds": step.duration, "latency": "client", "p99": step.p99}


def _requests(step, trial, policy):
    """The requests of one simulated step: ``step.over`` of its ``step.n`` over the target."""
    return pd.DataFrame({"trial": trial, "policy": policy, "status": [200] * step.n, "error": [""] * step.n,
                         "client_seconds": [0.5] * step.over + [0.01] * (step.n - step.over), "rate": step.rate})


def test_tune_writes_each_step_as_it_goes_and_a_resume_starts_from_them(tmp_path):
    """An interrupt after three steps keeps all three on disk; a resume's race starts from them."""
    from tuna_lab.measure.experiment import Config

    out = str(tmp_path / "tune")
    config = Config(1, 1, "small", 10)
    cfs = Candidate(1, 1, "cfs")
    records = TuneRecords(out, 0.05)
    evaluate, clock = simulated_race(2.0)
    written = []

    def recorded(candidate, rnd, next_step):
        # The simulated target, with each step written before the race hears of it (as tune's _Evaluator does).
        def keep(step):
            if step is not None and step.n:
                trial = records.next_trial(config, candidate.policy)
                records.add(config, _row(candidate, trial, rnd, step), _requests(step, trial, candidate.policy), None,
                            lambda: {"cell": config.key, "config": {}, "seed": 0})
                written.append(step)
                if len(written) == 3:
                    raise KeyboardInterrupt
            return next_step(step)
        evaluate(candidate, rnd, keep)

    with pytest.raises(KeyboardInterrupt):
        race([cfs], recorded, 0.05, 600, clock=clock, rules=RaceRules(step_seconds=1.0))
    requests, trials, _ = load_results(out)
    assert len(trials) == 3 and sorted(trials["rate"]) == sorted(s.rate for s in written)
    prior = TuneRecords(out, 0.05).load({config.key: config})
    def seen(steps):
        return [(s.rate, s.n, s.over, s.passed) for s in steps]

    assert seen(prior[cfs.name]) == seen(written)
    again, clock = simulated_race(2.0)
    resumed = race([cfs], again, 0.05, 600, clock=clock, rules=RaceRules(step_seconds=1.0), prior=prior)
    assert seen(resumed.steps[cfs.name][:3]) == seen(written)


def test_a_tune_resumes_only_its_own_folder(tmp_path):
    out = tmp_path / "tune"
    settings = {"kind": "tune", "sla_p99": 0.05, "model": "small", "batch": 10, "target": "lab", "seed": 0,
                "warmup": 20, "max_error_rate": 0.01}
    write_sweep_file(out, {**settings, "budget": 60})
    check_claim(str(out), "tune", settings)                                   # the same tune: resumed
    with pytest.raises(ExperimentError, match="other settings"):
        check_claim(str(out), "tune", {**settings, "sla_p99": 0.1})
    line = _refused(main("run", "-w", "1", "-t", "1", "--model", "small", "--batch", "10", "--out", out))
    assert "tune" in line
    with pytest.raises(TuneError, match="too short"):
        race([Candidate(1, 1, "cfs")], simulated_race(1.0)[0], 0.05, 60, rules=RaceRules(step_seconds=1e-9))


@pytest.mark.parametrize("command", [
    ["sweep", "--configs", "2x2", "--models", "small", "--batches", "100", "--policies", "cfs", "--trials", "1",
     "--requests", "5", "--out", "{x}"],
    ["run", "-w", "2", "-t", "2", "--model", "small", "--policies", "cfs", "--trials", "1", "--requests", "5",
     "--out", "{x}"],
])
def test_a_results_folder_at_a_cells_name_is_never_replaced_by_that_cell(tmp_path, command):
    """``run --out X/<cell>`` made X/<cell> a results folder: a sweep or run of X never writes that cell over it."""
    x = tmp_path / "x"
    shutil.copytree(SWEEP / CELL, x / CELL / CELL)
    (x / CELL / ".tuna-lab.lock").write_text("")
    before = _digest(x)
    line = _refused(main(*[a.format(x=x) for a in command], timeout=60))
    assert "holds other results" in line
    assert _digest(x) == before


@pytest.mark.parametrize("table", ["trials", "requests"])
def test_write_report_checks_every_tables_column_types_in_one_line(table, tmp_path):
    from tuna_lab.analysis.report import write_report
    from tuna_lab.errors import AnalysisError

    requests, trials, _ = load_results(str(SWEEP / CELL))
    frames = {"trials": trials, "requests": requests}
    frames[table] = frames[table].assign(policy=range(len(frames[table])))
    with pytest.raises(AnalysisError, match=f"{table} table: column policy holds int64, not text") as info:
        write_report(frames["requests"], frames["trials"], tmp_path / "r.html")
    assert "\n" not in str(info.value) and not (tmp_path / "r.html").exists()
