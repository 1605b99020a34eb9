"""A real pin-and-measure run at tiny size: records, statistics, report, resume, bad input."""

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from helpers import main
from tuna_lab._checks import format_cpulist
from tuna_lab.errors import ExperimentError
from tuna_lab.measure.experiment import (Config, LoadSpec, TrialSpec, grid, load_results, load_thread_cpu, machine_name,
                                        run)
from tuna_lab.measure.sweeps.local import ClusterSpec, sweep

CPUS = len(os.sched_getaffinity(0))
T = min(2, CPUS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "cell"
    seen = []

    def on_trial(part):
        # Called after the run is on disk: the partial cell holds every run so far, and nothing else.
        kept = pd.read_parquet(f"{out}.partial/trials.parquet")
        seen.append((len(kept), len(pd.read_parquet(f"{out}.partial/requests.parquet")), part.trials.iloc[0]["policy"],
                     kept.iloc[-1]["policy"], json.loads(open(f"{out}.partial/manifest.json").read())["partial"]))

    result = run(Config(2, T, "small", 20), ["cfs", "round-robin"], trials=2, load=LoadSpec(50, concurrency=10),
                 out=str(out), trial=TrialSpec(seed=3), on_trial=on_trial)
    return result, out, seen


def test_each_run_is_on_disk_as_it_finishes_and_the_partial_cell_goes_once_the_cell_is_written(tiny):
    _, out, seen = tiny
    assert [s[:2] for s in seen] == [(1, 50), (2, 100), (3, 150), (4, 200)]
    assert all(s[2] == s[3] and s[4] for s in seen)
    assert not os.path.exists(f"{out}.partial") and (out / "manifest.json").exists()


def test_the_load_is_timed_apart_from_start_up_warm_up_and_stop(tiny):
    from tuna_lab.measure.schema import PHASE_COLUMNS

    result, _, _ = tiny
    trials = result.trials
    for column in PHASE_COLUMNS:
        assert (trials[column] > 0).all(), column
    # The throughput is over the load alone; the server's start (seconds: Gunicorn, XGBoost) is not in it.
    assert trials["throughput"].to_numpy() == pytest.approx((trials["ok"] / trials["wall_seconds"]).to_numpy())
    assert (trials["startup_seconds"] > trials["wall_seconds"] / 100).all()
    spent = result.manifest["time"]
    assert spent["measuring_seconds"] == pytest.approx(trials["wall_seconds"].sum())
    assert spent["startup_seconds"] == pytest.approx(trials["startup_seconds"].sum())
    parts = spent["measuring_seconds"] + sum(spent[c] for c in PHASE_COLUMNS)
    assert parts <= spent["total_seconds"] and spent["measuring_seconds"] < spent["total_seconds"]


def test_a_write_error_stops_the_run_with_one_line_and_keeps_the_runs_written(tmp_path):
    from tuna_lab.errors import StoreError

    out = tmp_path / "c"

    def block(part):
        # The next partial cell cannot be written: its temporary folder's name is taken by a file.
        (tmp_path / f"c.partial.tmp-{os.getpid()}").write_text("in the way")

    # A server that cannot start (more threads than CPUs) fails its trial at once: a fast run that still writes.
    with pytest.raises(StoreError, match="could not write") as info:
        run(Config(1, CPUS + 1, "small", 10), ["cfs"], trials=3, load=LoadSpec(5), out=str(out), on_trial=block)
    assert "\n" not in str(info.value)
    kept = pd.read_parquet(tmp_path / "c.partial" / "trials.parquet")
    assert len(kept) == 1 and not out.exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs of its own (0755: a tmpfs is 1777 by default, which the results folder check refuses),
    unmounted after the test (mounting needs root, as in CI)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_runs_written(small_disk):
    from tuna_lab.errors import StoreError

    out = small_disk / "c"

    def fill(part):
        # After the first trial is on disk, the disk fills up (another program's file): ENOSPC from now on.
        with contextlib.suppress(OSError), open(small_disk / "filler", "ab") as fh:
            while True:
                fh.write(b"x" * 4096)
                fh.flush()

    with pytest.raises(StoreError, match="could not write.*No space left on device") as info:
        run(Config(1, CPUS + 1, "small", 10), ["cfs"], trials=3, load=LoadSpec(5), out=str(out), on_trial=fill)
    assert "\n" not in str(info.value)
    kept = pd.read_parquet(small_disk / "c.partial" / "trials.parquet")
    assert len(kept) == 1 and not out.exists()


def test_records_are_complete_and_tidy(tiny):
    result, _, _ = tiny
    req = result.requests
    assert len(req) == 2 * 2 * 50
    assert set(req["policy"]) == {"cfs", "round-robin"} and set(req["trial"]) == {0, 1}
    assert (req["status"] == 200).all()
    for col in ("client_seconds", "server_seconds", "deserialize", "convert", "dmatrix", "predict", "shap"):
        assert (req[col] > 0).all(), col
    assert req["pid"].nunique() >= 2                     # both workers served
    assert (req["client_seconds"] >= req["server_seconds"]).all()


def test_trial_p99_is_numpys_p99_of_the_raw_rows(tiny):
    result, _, _ = tiny
    for _, row in result.trials.iterrows():
        raw = result.requests[(result.requests.policy == row.policy) & (result.requests.trial == row.trial)]
        assert row.p99 == pytest.approx(np.percentile(raw["server_seconds"], 99))
        assert row.p50 == pytest.approx(np.percentile(raw["server_seconds"], 50))
        assert row.trial_status == "ok" and row.ok == 50


def test_policy_order_is_randomised_per_trial_and_recorded(tiny):
    result, _, _ = tiny
    orders = result.manifest["orders"]
    assert len(orders) == 2 and all(sorted(o) == ["cfs", "round-robin"] for o in orders)
    got = result.trials.sort_values(["trial", "order"]).groupby("trial")["policy"].apply(list).tolist()
    assert got == orders


def test_written_cell_reloads_with_its_manifest(tiny):
    result, out, _ = tiny
    requests, trials, manifests = load_results(str(out))
    pd.testing.assert_frame_equal(trials.reset_index(drop=True), result.trials.reset_index(drop=True))
    assert len(requests) == len(result.requests)
    m = manifests[0]
    for key in ("cpu_model", "kernel", "topology", "versions", "git_commit", "seed", "command", "config"):
        assert key in m
    assert m["config"]["model"] == "small"


def test_report_is_written_from_saved_results(tiny, tmp_path):
    _, out, _ = tiny
    html = tmp_path / "report.html"
    p = main("report", out, "-o", html)
    assert p.returncode == 0, p.stderr
    text = html.read_text()
    assert "round-robin" in text and "<html" in text.lower()
    # the generator's CPU per request beside the server's, and where it ran
    assert "generator CPU ms/req" in text and "server CPU ms/req" in text and "<dt>load generator</dt>" in text
    # issue 50: the serving CPUs' clocks (or why there are none) and the runtimes' wait settings
    assert "<dt>CPU frequency</dt>" in text and "KMP_BLOCKTIME=" in text and "allow_spinning=default" in text


def test_every_trial_records_the_generator_cost(tiny):
    result, _, _ = tiny
    trials = result.trials
    for col in ("generator_cpu_user", "generator_cpu_sys", "generator_cpu_seconds", "generator_cpu_per_request",
                "generator_cpus", "generator_processes", "generator_wall_seconds", "server_cpus"):
        assert col in trials.columns, col
    assert (trials["generator_cpu_seconds"] > 0).all() and (trials["generator_cpu_per_request"] > 0).all()
    assert trials["generator_cpu_per_request"].to_numpy() == pytest.approx(
        (trials["generator_cpu_seconds"] / trials["n"]).to_numpy())
    if CPUS < 8:   # the default here keeps nothing: the generator and the server share every CPU
        everything = format_cpulist(os.sched_getaffinity(0))
        assert set(trials["generator_cpus"]) == {everything} and set(trials["server_cpus"]) == {everything}
        assert result.manifest["client_cpus"]["cpus"] == [] and result.manifest["client_cpus"]["how"] == "default"
    total = result.manifest["generator"]
    assert total["cpu_seconds"] == pytest.approx(trials["generator_cpu_seconds"].sum())
    assert total["requests"] == 2 * 2 * 50 and total["runs"] == 4


def test_old_results_without_the_generator_columns_still_load_and_report(tiny, tmp_path):
    from tuna_lab.measure.schema import GENERATOR_COLUMNS

    _, out, _ = tiny
    old = tmp_path / "old" / out.name
    shutil.copytree(out, old)
    table = pd.read_parquet(old / "trials.parquet")
    table.drop(columns=list(GENERATOR_COLUMNS)).to_parquet(old / "trials.parquet", index=False)
    threads = pd.read_parquet(old / "threads.parquet")
    threads.drop(columns=["cpus"]).to_parquet(old / "threads.parquet", index=False)
    meta = json.loads((old / "manifest.json").read_text())
    for key in ("client_cpus", "generator"):
        meta.pop(key)
    (old / "manifest.json").write_text(json.dumps(meta))
    _, trials, _ = load_results(str(old.parent))
    assert "generator_cpu_seconds" not in trials.columns
    html = tmp_path / "old.html"
    p = main("report", old.parent, "-o", html, "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["cpu"]
    assert rows and all(r["generator_cpu_per_request"] is None and r["server_cpu_per_request"] > 0 for r in rows)
    assert "generator CPU ms/req" in html.read_text()


def test_sweep_resumes_without_redoing_finished_cells(tmp_path):
    out = tmp_path / "sweep"
    configs = [Config(1, 1, "small", 10), Config(2, 1, "small", 10)]
    said = []
    # A budget the second cell's estimate does not fit: it is not started, and said to be left for a resume.
    sweep(configs, ["cfs"], str(out), trials=1, requests=20, budget=600, progress=said.append,
          estimate=lambda c: 1e4 if c == configs[1] else 1.0)
    assert not (out / configs[1].key).exists() and any("1 cells not run (w2-t1-small-b10)" in s for s in said)
    settings = json.loads((out / "sweep.json").read_text())
    assert settings["configs"] == sorted(c.key for c in configs) and settings["budget"] == 600
    first = {c.key: os.path.getmtime(out / c.key / "manifest.json") for c in configs[:1]}
    lines = []
    sweep(configs, ["cfs"], str(out), trials=1, requests=20, progress=lines.append)
    assert "1 of 2 cells already finished" in lines[0]
    assert os.path.getmtime(out / configs[0].key / "manifest.json") == first[configs[0].key]
    assert (out / configs[1].key / "manifest.json").exists()
    _, trials, manifests = load_results(str(out))
    assert len(manifests) == 2 and len(trials) == 2
    # Other settings are refused before anything runs, here and on a cluster (which goes through sweep() too).
    with pytest.raises(ExperimentError, match="trials 1 there, 2 now"):
        sweep(configs, ["cfs"], str(out), trials=2, requests=20)
    with pytest.raises(ExperimentError, match=r"policies \['cfs'\] there, \['cfs', 'round-robin'\] now"):
        sweep(configs, ["cfs", "round-robin"], str(out), trials=1, requests=20, cluster=ClusterSpec(object()))


def test_a_server_that_cannot_start_marks_the_trial_failed(tmp_path):
    # More threads than CPUs cannot be served here; the trial fails with the reason, the run goes on.
    result = run(Config(1, CPUS + 1, "small", 10), ["cfs"], trials=1, load=LoadSpec(5), out=str(tmp_path / "c"))
    row = result.trials.iloc[0]
    assert row.trial_status == "failed" and "capped" in row.reason
    assert json.load(open(tmp_path / "c" / "manifest.json"))["config"]["threads"] == CPUS + 1


@pytest.mark.parametrize("make", [
    lambda: Config(0, 1), lambda: Config(1, 1, "huge"), lambda: Config(1, 1, batch=0),
    lambda: run(Config(1, 1, "small"), ["nope"]), lambda: grid("galaxy"),
])
def test_bad_input_raises_one_clear_error(make):
    with pytest.raises(ExperimentError) as info:
        make()
    assert "\n" not in str(info.value)


def test_corrupt_or_foreign_results_folder(tmp_path):
    with pytest.raises(ExperimentError, match="no results folder"):
        load_results(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExperimentError, match="no finished"):
        load_results(str(tmp_path / "empty"))
    cell = tmp_path / "bad" / "w1-t1-small-b10"
    cell.mkdir(parents=True)
    (cell / "manifest.json").write_text("{}")
    (cell / "trials.parquet").write_text("this is not parquet")
    with pytest.raises(ExperimentError, match="not a readable"):
        load_results(str(tmp_path / "bad"))
    p = main("report", tmp_path / "bad")
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1      # results that cannot be read


def test_machine_grid_keeps_threads_within_cpus_and_article_grid_is_36():
    assert len(grid("article")) == 36
    g = grid("machine", cpus=2)
    assert all(1 <= t <= 2 and w >= 1 for w, t in g)
    assert any(w * t > 2 for w, t in g) and any(w * t <= 2 for w, t in g)


def test_results_of_several_machines_load_with_the_machine_as_a_column(tiny, tmp_path):
    result, out, _ = tiny
    single = load_results(str(out.parent))
    assert "machine" not in single[1].columns and "machine" not in single[2][0]       # one machine: unchanged
    assert result.manifest["hostname"] and len(result.manifest["fingerprint"]) == 16
    # A cluster sweep's tree: <out>/<machine>/<cell>, and a partial cell that must not count.
    tree = tmp_path / "cluster"
    for name in ("host-aaaaaaaa", "host-bbbbbbbb"):
        shutil.copytree(out, tree / name / out.name)
    shutil.copytree(out, tree / "host-bbbbbbbb" / "w9-t9-small-b20.partial")
    requests, trials, manifests = load_results(str(tree))
    assert sorted(trials["machine"].unique()) == ["host-aaaaaaaa", "host-bbbbbbbb"]
    assert len(trials) == 2 * len(result.trials) and len(requests) == 2 * len(result.requests)
    assert [m["machine"] for m in manifests] == ["host-aaaaaaaa", "host-bbbbbbbb"]
    assert set(load_thread_cpu(str(tree))["machine"]) == {"host-aaaaaaaa", "host-bbbbbbbb"}
    assert machine_name(manifests[0]) == f"{manifests[0]['hostname']}-{manifests[0]['fingerprint'][:8]}"


def test_machine_options_need_a_client(tmp_path):
    with pytest.raises(ExperimentError, match="client"):
        sweep([Config(1, 1, "small", 10)], ["cfs"], str(tmp_path), cluster=ClusterSpec(None, per_machine=True))
    # The names sweep() took before ClusterSpec are refused at once, saying where they went.
    with pytest.raises(ExperimentError, match=r"per_machine as cluster=ClusterSpec\(client, per_machine=True\)"):
        sweep([Config(1, 1, "small", 10)], ["cfs"], str(tmp_path), per_machine=True)


def test_an_article_design_and_its_cuts_reach_sweep_json(tmp_path):
    # No server: a 1 s budget with cells estimated at 100 s each runs none, but sweep.json is written first.
    from tuna_lab.measure.sweeps.article import article_design

    design = article_design(2, budget=600)
    lines = []
    sweep(design.configs[:2], ["cfs"], str(tmp_path / "s"), trials=1, requests=10, budget=1,
          estimate=lambda config: 100.0, design=design, progress=lines.append)
    settings = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert settings["cuts"] == [str(c) for c in design.cuts] and settings["cuts"]
    assert settings["design"]["summary"] == design.describe()
    assert any(line == f"sweep: {design.describe()}" for line in lines)
    assert not any((tmp_path / "s" / c.key).exists() for c in design.configs[:2])
    with pytest.raises(ExperimentError, match="design must be an ArticleDesign"):
        sweep(design.configs[:1], ["cfs"], str(tmp_path / "t"), design=design.to_dict())
    with pytest.raises(ExperimentError, match="cluster must be a ClusterSpec"):
        sweep(design.configs[:1], ["cfs"], str(tmp_path / "t"), cluster="tcp://127.0.0.1:1")


def test_a_cell_with_no_valid_trial_is_written_but_not_finished_and_a_rewrite_replaces_it_whole(tmp_path):
    from tuna_lab.measure.experiment import Result
    from tuna_lab.measure.store import finished_keys, is_finished, write_cell

    def result(statuses):
        trials = pd.DataFrame({"policy": "cfs", "trial": range(len(statuses)), "trial_status": statuses,
                               "p99": 0.1})
        return Result(pd.DataFrame({"status": [503]}), trials, {"config": {"workers": 1}})

    cell = str(tmp_path / "w1-t1-small-b100")
    write_cell(cell, result(["failed", "failed"]))
    assert os.path.isfile(os.path.join(cell, "manifest.json")) and not is_finished(cell)
    assert finished_keys(str(tmp_path)) == set()        # a resume redoes it
    write_cell(cell, result(["failed", "ok"]))
    assert is_finished(cell) and json.load(open(os.path.join(cell, "manifest.json")))["valid_trials"] == 1
    assert sorted(os.listdir(tmp_path)) == ["w1-t1-small-b100"]     # no temporary or old folder left
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / "manifest.json").write_text("[1, 2")
    assert not is_finished(str(tmp_path / "garbled"))     # a resume redoes it; the readers refuse it, loudly
    with pytest.raises(ExperimentError, match="garbled is not a readable tuna-lab result"):
        load_results(str(tmp_path))


def test_one_measurement_per_results_folder(tmp_path):
    import threading

    from tuna_lab.measure.store import lock_folder

    folder = str(tmp_path / "results")
    with lock_folder(folder):
        with lock_folder(folder):                 # the same thread again: a sweep's own cells
            pass
        errors = []

        def other():
            try:
                with lock_folder(folder):
                    pass
            except ExperimentError as exc:
                errors.append(str(exc))

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert errors and "in use by another measurement in this process" in errors[0]
        # Another process: refused at once, naming the holder.
        p = subprocess.run([sys.executable, "-c", "from tuna_lab.measure.store import lock_folder\n"
                            f"with lock_folder({folder!r}): pass"], capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and f"in use by process {os.getpid()}" in p.stderr
    # Released: another process may take it now.
    p = subprocess.run([sys.executable, "-c", "from tuna_lab.measure.store import lock_folder\n"
                        f"with lock_folder({folder!r}): pass"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_run_records_a_relaxed_tuna_mapping_once_per_cell(tmp_path, monkeypatch, capsys):
    """`tuna-lab run` end to end with a relaxed tuna-scatter mapping: the note said once (not once per
    trial), the manifest's ``placements`` and the trial rows' ``relaxed`` say what it exceeds.

    No configuration is relaxed on a machine this small (the families conflict only for
    (T-1)C/T < W < C, none on 2 CPUs, and ``run`` serves on this machine's CPUs), so the solver's
    answer is marked relaxed here; a real relaxed mapping is placed in tests/test_relax.py."""
    from dataclasses import replace

    import tuna_lab.model.tuna as tuna
    from tuna_lab.cli import main
    from tuna_lab.model.mapping import Relaxed

    real, solved = tuna.solve, []

    def relaxed(*args, **kwargs):
        solved.append(args[:2])
        return replace(real(*args, **kwargs), status="relaxed",
                       relaxed=(Relaxed("11-12", 1.0, "1 core with a main thread carries U threads, above 0"),))

    monkeypatch.setattr(tuna, "solve", relaxed)
    out = tmp_path / "runs"
    assert main(["run", "-w", "2", "-t", str(T), "--model", "small", "--batch", "10", "--policies",
                 "cfs,tuna-scatter", "--trials", "2", "--requests", "10", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("tuna-lab: note:")]
    assert len(notes) == 1 and "tuna-scatter 2x" in notes[0] and "(11-12) exceeded by 1" in notes[0], err
    assert len(solved) == 1                               # solved once for the cell, not per trial
    _, trials, manifests = load_results(str(out))
    placed = manifests[0]["placements"]
    assert set(placed) == {"tuna-scatter"} and placed["tuna-scatter"]["status"] == "relaxed"
    # The one plan every trial of the cell ran, with its hash; cfs pins nothing.
    plans = manifests[0]["plans"]
    assert set(plans) == {"tuna-scatter"} and plans["tuna-scatter"]["plan"]["relaxed"]
    # The hash is of what the plan pins: not of the policy's name or the relaxed mapping's status.
    pins = {k: v for k, v in plans["tuna-scatter"]["plan"].items() if k not in ("policy", "status", "relaxed")}
    text = json.dumps(pins, sort_keys=True, separators=(",", ":"))
    assert plans["tuna-scatter"]["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert placed["tuna-scatter"]["relaxed"] == [
        {"family": "11-12", "amount": 1.0, "message": "1 core with a main thread carries U threads, above 0"}]
    rows = trials.set_index(["policy", "trial"])["relaxed"]
    assert (rows.loc["cfs"] == "").all() and rows.loc["tuna-scatter"].str.startswith("(11-12) exceeded by 1").all()


def test_limits_are_checked_before_any_server_starts(tmp_path, monkeypatch):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out = tmp_path / "c"
    try:
        # A soft limit the load would exceed is raised (the hard one allows it); then the batch is refused.
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
        monkeypatch.setenv("TUNA_LAB_MAX_BODY", "1000")
        with pytest.raises(ExperimentError, match=r"body of \d+ bytes \(batch 20 of small\) exceeds .* 1000 bytes"):
            run(Config(1, 1, "small", 20), ["cfs"], trials=1, load=LoadSpec(300), out=str(out))
        monkeypatch.delenv("TUNA_LAB_MAX_BODY")
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 300
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    monkeypatch.setenv("TUNA_LAB_MAX_ROWS", "5")
    with pytest.raises(ExperimentError, match="batch 10 exceeds the server's limit of 5 rows"):
        sweep([Config(1, 1, "small", 4), Config(1, 1, "small", 10)], ["cfs"], str(tmp_path / "s"), trials=1,
              requests=5)
    monkeypatch.delenv("TUNA_LAB_MAX_ROWS")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TUNA_LAB_CACHE", str(tmp_path / "file" / "models"))
    with pytest.raises(ExperimentError, match="not cached and cannot be trained"):
        run(Config(1, 1, "small", 4), ["cfs"], trials=1, load=LoadSpec(5), out=str(out))
    # Nothing was measured, so nothing was written: no cell, no partial one, no sweep cell.
    assert not out.exists() and not (tmp_path / "c.partial").exists() and not list((tmp_path / "s").glob("w*"))


def test_a_hard_descriptor_limit_below_the_load_is_one_line_and_exit_2(tmp_path):
    import resource

    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))

    p = subprocess.run([sys.executable, "-m", "tuna_lab", "run", "--workers", "1", "--threads", "1", "--model",
                        "small", "--batch", "5", "--policies", "cfs", "--trials", "1", "--requests", "500",
                        "--out", str(tmp_path / "c")], capture_output=True, text=True, timeout=120, preexec_fn=low)
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert p.returncode == 2 and len(errors) == 1, p.stderr
    assert "hard limit is 100" in errors[0] and not (tmp_path / "c").exists()


def _hold_cpus(cpus, seconds):
    """Another process holding ``cpus`` for ``seconds``; returns once it holds them."""
    p = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom tuna_lab.measure.cpulock import lock_cpus\n"
                          f"with lock_cpus({sorted(cpus)!r}):\n    print('held', flush=True)\n"
                          f"    time.sleep({seconds})\n"], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_two_measurements_never_share_a_cpu_and_the_second_waits_or_refuses(tmp_path, monkeypatch):
    from tuna_lab.measure.cpulock import lock_cpus

    mine = sorted(os.sched_getaffinity(0))
    holder = _hold_cpus(mine[:1], 60)
    try:
        monkeypatch.setenv("TUNA_LAB_CPU_LOCK_WAIT", "0")
        with pytest.raises(ExperimentError, match=f"in use by process {holder.pid}") as info:
            run(Config(1, 1, "small", 5), ["cfs"], trials=1, load=LoadSpec(5), out=str(tmp_path / "c"))
        assert "\n" not in str(info.value) and not (tmp_path / "c").exists()
        if len(mine) > 1:
            with lock_cpus(mine[1:]):            # disjoint CPUs: side by side, as the cluster's taskset workers
                pass
    finally:
        holder.kill()
        holder.wait()
    # The second waits (and says so) while the first holds the CPUs, then runs.
    holder = _hold_cpus(mine, 1.0)
    monkeypatch.setenv("TUNA_LAB_CPU_LOCK_WAIT", "30")
    lines = []
    try:
        t0 = time.monotonic()
        # A server that cannot start (more threads than CPUs) fails its trial at once: only the wait takes time.
        result = run(Config(1, CPUS + 1, "small", 5), ["cfs"], trials=1, load=LoadSpec(5), progress=lines.append)
        assert time.monotonic() - t0 >= 0.5 and len(result.trials) == 1
        assert lines[0].startswith("waiting up to 30 s") and f"process {holder.pid}" in lines[0]
    finally:
        holder.kill()
        holder.wait()
    # Without a progress line the wait is a warning, never silent.
    holder = _hold_cpus(mine[:1], 0.5)
    try:
        with pytest.warns(UserWarning, match=f"waiting up to 30 s .* in use by process {holder.pid}"):
            with lock_cpus(mine[:1]):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_cpu_lock_files_are_never_followed_and_an_untrusted_folder_is_refused(tmp_path, monkeypatch):
    from tuna_lab.measure.cpulock import lock_cpus

    folder = tmp_path / "locks"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("TUNA_LAB_LOCK_DIR", str(folder))
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (folder / "cpu3.lock").symlink_to(victim)
    with pytest.raises(ExperimentError, match="is a symbolic link"):
        with lock_cpus([3]):
            pass
    assert victim.read_text() == "keep me"
    with lock_cpus([4]):
        assert (folder / "cpu4.lock").stat().st_size == 0       # nothing is ever written to a lock file
    os.chmod(folder, 0o777)
    with pytest.raises(ExperimentError, match="may be written by other users"):
        with lock_cpus([4]):
            pass
