"""``tuna-lab plan``: every format checked for what it says, not just printed.

The CLI runs in this process (``tuna_lab.cli.main``, helpers.main); its output is
parsed back and compared with the library's :class:`~tuna_lab.placement.plan.Plan`.
The ``taskset`` format with ``--pid`` of a running server is in ``test_pin.py``,
beside the servers.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import main
from tuna_lab._checks import format_cpulist
from tuna_lab.errors import PlanError
from tuna_lab.machine import Topology, topology_from
from tuna_lab.machine.fingerprint import fingerprint
from tuna_lab.placement import placement
from tuna_lab.placement.plan import FORMATS, PLAN_FORMAT, Plan, parse_omp_places

HERE = topology_from(None)
DATA = Path(__file__).parent / "data"
# The machine has 2 CPUs: W=2, T=2 is the realistic case here.
W, T = 2, min(2, len(HERE.cpus))


def plan_cli(*args):
    done = main("plan", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def plans():
    """``plans(*ARGS)``: ``tuna-lab plan -w W -t T ARGS``'s output on this machine, each ARGS run once."""
    outputs = {}

    def output(*args):
        if args not in outputs:
            outputs[args] = plan_cli("-w", str(W), "-t", str(T), *args)
        return outputs[args]

    return output


@pytest.fixture(scope="module")
def scatter_json(plans):
    """``tuna-lab plan --policy tuna-scatter`` on this machine (the solver's plan, shared by the formats' tests)."""
    return plans("--policy", "tuna-scatter")


# -- json ---------------------------------------------------------------------------------------

def _check_schema(data, policy, workers, threads, topology):
    assert data["format"] == PLAN_FORMAT
    assert data["policy"] == policy
    assert (data["workers"], data["threads"]) == (workers, threads)
    assert data["pinned_by"] in ("tuna_lab", "openmp", "none")
    assert isinstance(data["env"], dict)
    assert data["topology"]["cpus"] == list(topology.cpus)
    assert data["topology"]["fingerprint"] == fingerprint(topology)
    assert [s["slot"] for s in data["slots"]] == list(range(workers))
    for s in data["slots"]:
        assert len(s["pool"]) == threads - 1
        for cpus in [s["main"], *s["pool"]]:
            assert cpus and set(cpus) <= set(topology.cpus) and cpus == sorted(cpus)


@pytest.mark.parametrize("args,topology", [
    ([], HERE),
    (["--synthetic", "core:4 pu:1"], Topology.synthetic("core:4 pu:1")),
    (["--preset", "xeon-8272cl"], Topology.preset("xeon-8272cl")),
    (["--hwloc-xml", str(DATA / "v2_linux_smt.xml")], Topology.from_hwloc_xml(str(DATA / "v2_linux_smt.xml"))),
], ids=["this-machine", "synthetic", "preset", "hwloc-xml"])
def test_json_format_is_the_plan_and_round_trips(args, topology):
    text = plan_cli("-w", str(W), "-t", str(T), "--policy", "round-robin", *args)
    data = json.loads(text)
    _check_schema(data, "round-robin", W, T, topology)
    plan = Plan.from_dict(data)
    assert plan == placement("round-robin", W, T, topology).plan()
    assert plan.to_dict() == data
    assert json.loads(plan.render("json")) == data


def test_json_of_a_synthetic_machine_has_the_expected_cpus():
    data = json.loads(plan_cli("-w", "2", "-t", "2", "--policy", "round-robin", "--synthetic", "core:4 pu:1"))
    assert [(s["main"], s["pool"]) for s in data["slots"]] == [([0], [[1]]), ([2], [[3]])]


def test_tuna_scatter_plan_of_this_machine_puts_each_thread_of_a_slot_apart(scatter_json):
    data = json.loads(scatter_json)
    _check_schema(data, "tuna-scatter", W, T, HERE)
    plan = Plan.from_dict(data)
    for row in plan.slots:
        assert len({c for cpus in row for c in cpus}) == T      # main and pool on different CPUs
    assert plan.check_machine(HERE) is plan


def test_plan_file_write_read_and_json_text(tmp_path, scatter_json):
    plan = Plan.read(scatter_json)                              # JSON text, as TUNA_LAB_PLAN may hold
    plan.write(tmp_path / "plan.json")
    assert Plan.read(str(tmp_path / "plan.json")) == plan       # a file
    assert json.loads((tmp_path / "plan.json").read_text()) == plan.to_dict()


def test_a_plan_for_another_machine_is_refused_even_forced_when_its_cpus_are_not_here():
    if len(HERE.cpus) >= 4:
        pytest.skip("this machine has CPUs 2-3: the preset's plan would fit")
    plan = Plan.read(plan_cli("-w", "2", "-t", "2", "--policy", "round-robin", "--preset", "xeon-8272cl"))
    assert plan.topology == "xeon-8272cl" and plan.fingerprint != fingerprint(HERE)
    with pytest.raises(PlanError, match="another machine"):
        plan.check_machine(HERE)
    with pytest.raises(PlanError, match="CPUs 2-3"):
        plan.check_machine(HERE, force=True)
    # Forced, a plan of another machine whose CPUs all exist here is accepted.
    small = placement("round-robin", 1, 2, Topology.preset("xeon-8272cl")).plan()
    assert small.check_machine(HERE, force=True) is small


@pytest.mark.parametrize("data,match", [
    ({"format": "something/1"}, "not a tuna_lab plan"),
    ([], "not a tuna_lab plan"),
    ({"format": PLAN_FORMAT, "policy": "x"}, "malformed plan"),
    ({"format": PLAN_FORMAT, "policy": "x", "workers": 1, "threads": 1, "topology": {"cpus": [0], "fingerprint": "f"},
      "slots": [{"slot": 1, "main": [0], "pool": []}]}, "numbered 0..W-1"),
])
def test_not_a_plan_is_a_plan_error(data, match):
    with pytest.raises(PlanError, match=match):
        Plan.from_dict(data)
    if isinstance(data, dict):
        with pytest.raises(PlanError, match=match):
            Plan.read(json.dumps(data))


def test_bad_plans_are_plan_errors(tmp_path):
    with pytest.raises(PlanError, match="CPU 7 is not one of them"):
        Plan("round-robin", 1, 2, [[[0], [7]]], [0, 1], "f")
    with pytest.raises(PlanError, match="1 workers x 2 threads needs"):
        Plan("round-robin", 1, 2, [[[0]]], [0, 1], "f")
    with pytest.raises(PlanError, match="fingerprint"):
        Plan("round-robin", 1, 1, [[[0]]], [0, 1], "")
    with pytest.raises(PlanError, match="cannot read plan"):
        Plan.read(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PlanError, match="is not JSON"):
        Plan.read(str(tmp_path / "bad.json"))


# -- omp-places ---------------------------------------------------------------------------------

_OMP_LINE = re.compile(r'^slot (\d+): OMP_PLACES="([^"]*)" OMP_PROC_BIND=close OMP_NUM_THREADS=(\d+)$')


@pytest.mark.parametrize("args", [["--policy", "tuna-scatter"], ["--policy", "round-robin"],
                                  ["--policy", "round-robin", "--synthetic", "pack:2 core:2 pu:2"]],
                         ids=["tuna-scatter", "round-robin", "synthetic"])
def test_omp_places_format_parses_back_to_the_plan(args, plans):
    text = plans(*args, "--format", "omp-places")
    plan = Plan.read(plans(*args))
    lines = text.splitlines()
    assert lines[0].startswith("# ") and plan.fingerprint in lines[0]
    # The head, comment lines (what the format cannot do for every server), one line a slot.
    assert all(line.startswith("# ") for line in lines[:-plan.workers])
    for w, line in enumerate(lines[-plan.workers:]):
        m = _OMP_LINE.match(line)
        assert m, line
        assert int(m.group(1)) == w and int(m.group(3)) == plan.threads
        assert parse_omp_places(m.group(2)) == list(plan.slots[w])
        assert m.group(2) == plan.omp_places(w)


@pytest.mark.parametrize("text,places", [
    ("{0,16},{8:2}", [(0, 16), (8, 9)]),
    ("{3}", [(3,)]),
    ("{0:4},{4:4}", [(0, 1, 2, 3), (4, 5, 6, 7)]),
])
def test_parse_omp_places(text, places):
    assert parse_omp_places(text) == places


@pytest.mark.parametrize("text", ["0,1", "{0},x", "threads", "{a}", "{}", "{0:-1}", "{0},{1"])
def test_parse_omp_places_refuses_what_is_not_an_explicit_list(text):
    with pytest.raises(PlanError, match="not an explicit OMP_PLACES list"):
        parse_omp_places(text)


# -- taskset (placeholders; with --pid in test_pin.py) --------------------------------------------

def test_taskset_format_without_a_server_names_every_thread_of_every_slot(scatter_json, plans):
    plan = Plan.read(scatter_json)
    text = plans("--policy", "tuna-scatter", "--format", "taskset")
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(body) == plan.workers * plan.threads
    for line in body:
        # The placeholder is one quoted word: a line run by sh passes it to taskset, which refuses it.
        m = re.fullmatch(r"taskset -p -c (\S+) '<TID of slot (\d+) rank (\d+)>'", line)
        assert m, line
        w, t = int(m.group(2)), int(m.group(3))
        # Not knowing the runtime, a main thread gets all of its slot's CPUs: never fewer than its pool
        # (XGBoost would size its pool from them); the export says so.
        want = sorted({c for cpus in plan.slots[w] for c in cpus}) if t == 0 else plan.slots[w][t]
        assert m.group(1) == format_cpulist(want), line
    assert "Main threads (rank 0) get all of their slot's CPUs" in text


def test_taskset_main_thread_follows_the_main_rule_given_with_the_threads():
    plan = placement("round-robin", 1, 2, Topology.synthetic("core:2 pu:1")).plan()
    threads = [{"slot": 0, "rank": 0, "tid": 100, "pid": 100, "main_note": "x: XGBoost loaded: it counts"},
               {"slot": 0, "rank": 1, "tid": 101}]
    loose = plan.render("taskset", tids=[{**threads[0], "exact_main": False}, threads[1]]).splitlines()
    assert loose[1:] == ["# worker 100 (slot 0): main thread on all of slot 0's CPUs 0-1, not only CPU 0: "
                         "XGBoost loaded: it counts", "taskset -p -c 0-1 100", "taskset -p -c 1 101"]
    exact = plan.render("taskset", tids=[{**threads[0], "exact_main": True, "main_note": "x: ONNX Runtime"},
                                         threads[1]]).splitlines()
    assert exact[1:] == ["# worker 100 (slot 0): main thread on CPU 0 alone: ONNX Runtime", "taskset -p -c 0 100",
                         "taskset -p -c 1 101"]


# -- gunicorn -----------------------------------------------------------------------------------

_EXEC_SNIPPET = """
import json, os, sys
snippet = sys.stdin.read()
config = {}
exec(compile(snippet, "gunicorn.conf.py", "exec"), config)
print(json.dumps({
    "plan": os.environ["TUNA_LAB_PLAN"],
    "hooks": sorted(n for n in ("post_fork", "post_worker_init", "child_exit", "on_exit")
                    if callable(config.get(n))),
    "workers": config["workers"], "worker_class": config.get("worker_class"),
    "heavy": sorted(m for m in ("cvxpy", "highspy", "plotly", "xgboost") if m in sys.modules),
}))
"""


def _exec_gunicorn_snippet(snippet):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNA_LAB_")}
    done = subprocess.run([sys.executable, "-c", _EXEC_SNIPPET], input=snippet, capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_gunicorn_snippet_sets_the_plan_and_imports_the_hooks(scatter_json, plans):
    plan = Plan.read(scatter_json)
    snippet = plans("--policy", "tuna-scatter", "--format", "gunicorn")
    got = _exec_gunicorn_snippet(snippet)
    assert Plan.read(got["plan"]) == plan
    assert got["hooks"] == ["child_exit", "on_exit", "post_fork", "post_worker_init"]
    # The user's worker class is kept (issue 47): pasted into a gthread config, the snippet changes no setting.
    assert (got["workers"], got["worker_class"]) == (plan.workers, None)
    assert got["heavy"] == []                   # the hooks load no solver, plotting or XGBoost


@pytest.mark.parametrize("worker_class", ["sync", "gthread", "my_app.workers.Sync"])
def test_gunicorn_snippet_sets_a_worker_class_only_when_named(worker_class):
    done = main("plan", "-w", "2", "-t", "2", "--policy", "round-robin", "--preset", "xeon-8272cl",
                "--format", "gunicorn", "--worker-class", worker_class)
    assert done.returncode == 0, done.stderr
    got = _exec_gunicorn_snippet(done.stdout)
    assert got["worker_class"] == worker_class
    says = "the placement is per slot"
    # gthread: what the plan places, in the snippet and on stderr; a class the hooks do not take is warned of.
    comments = " ".join(line.removeprefix("# ") for line in done.stdout.splitlines() if line.startswith("#"))
    assert (says in comments, says in done.stderr) == ((worker_class == "gthread"),) * 2
    assert ("refused in one line when it starts" in done.stderr) == (worker_class != "sync")


def test_gunicorn_snippet_without_a_worker_class_says_what_gthread_gets():
    done = main("plan", "-w", "2", "-t", "3", "--policy", "round-robin", "--preset", "xeon-8272cl",
                "--format", "gunicorn")
    assert done.returncode == 0
    notes = [line for line in done.stderr.splitlines() if line.startswith("tuna-lab: note: ")]
    assert len(notes) == 2 and "sets none" in notes[0] and "2 x K x 3 threads" in notes[1], done.stderr
    assert "# worker_class: this snippet sets none" in done.stdout


@pytest.mark.parametrize("fmt", ["env", "omp-places", "onnxruntime"])
def test_per_worker_formats_say_which_servers_cannot_give_each_worker_its_value(fmt):
    done = main("plan", "-w", "2", "-t", "2", "--policy", "round-robin", "--preset", "xeon-8272cl", "--format", fmt)
    assert done.returncode == 0
    for text in (done.stdout, done.stderr):
        assert "uvicorn --workers and BentoML" in text and "tuna_lab.integrations.gunicorn" in text, text
        assert "tuna-lab pin --pid MASTER" in " ".join(text.replace("# ", "").split()), text


def test_gunicorn_snippet_survives_quotes_and_backslashes_in_names():
    plan = Plan("round-robin", 1, 2, [[[0], [1]]], HERE.cpus, fingerprint(HERE), topology='it\'s "odd" \\ \u00e9')
    got = _exec_gunicorn_snippet(plan.render("gunicorn"))
    assert Plan.read(got["plan"]) == plan


# -- bad input: one line, exit status 2 ---------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["-w", "0", "-t", "2"],
    ["-w", "2", "-t", "2", "--policy", "nope"],
    ["-w", "2", "-t", "2", "--format", "yaml"],
    ["-w", "2", "-t", "2", "--preset", "nope"],
    ["-w", "2", "-t", "2", "--hwloc-xml", "/nonexistent.xml"],
    ["-w", "2", "-t", "2", "--policy", "round-robin", "--format", "taskset", "--pid", "0"],
], ids=["zero-workers", "policy", "format", "preset", "hwloc-xml", "pid-0"])
def test_bad_plan_input_is_one_line_and_status_2(args):
    done = main("plan", *args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""


def test_every_format_is_offered():
    from tuna_lab.cli import build_parser
    from tuna_lab.placement import names

    assert set(FORMATS) == {"json", "omp-places", "env", "onnxruntime", "taskset", "gunicorn"}
    # One table (issue 48): the CLI offers the library's own, which names.py holds for a light start.
    sub = [a for a in build_parser()._actions if a.dest == "command"][0]
    (fmt,) = [a for a in sub.choices["plan"]._actions if a.dest == "format"]
    assert fmt.choices is FORMATS is names.FORMATS
    with pytest.raises(PlanError, match="unknown plan format"):
        placement("round-robin", 1, 1, HERE).plan().render("yaml")


# -- the hooks' state folder trusts no one else's files ------------------------------------------

def test_the_hooks_state_folder_is_trusted_only_when_it_is_a_private_folder_of_an_owner(tmp_path):
    import os

    from tuna_lab.live.state import trusted_hook_dir

    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    assert trusted_hook_dir(mine, {os.geteuid()})
    assert not trusted_hook_dir(mine, {os.geteuid() + 1})          # someone else's
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert not trusted_hook_dir(shared, {os.geteuid()})            # others may plant files in it
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert not trusted_hook_dir(link, {os.geteuid()})              # a symlink, even to a good folder
    assert not trusted_hook_dir(tmp_path / "absent", {os.geteuid()})


def test_the_hooks_state_folder_is_named_by_the_kernels_start_time_not_the_wall_clock():
    import os

    import psutil

    from tuna_lab.live.state import hook_dir

    with open(f"/proc/{os.getpid()}/stat") as fh:
        ticks = fh.read().rsplit(")", 1)[1].split()[19]
    name = os.path.basename(hook_dir(os.getpid()))
    assert name == f"tuna_lab-gunicorn-{psutil.Process().uids().real}-{os.getpid()}-{ticks}"


def test_a_cpu_list_given_as_text_is_refused_not_read_digit_by_digit():
    from tuna_lab.errors import PlanError
    from tuna_lab.machine import topology_from
    from tuna_lab.placement import placement
    from tuna_lab.placement.plan import Plan

    data = placement("round-robin", 2, 1, topology_from(None)).plan().to_dict()
    for bad in ("10", [True], [-1], ["1"], None):
        broken = {**data, "slots": [{**data["slots"][0], "main": bad}, *data["slots"][1:]]}
        with pytest.raises(PlanError, match="slot 0 main must be a list of CPU ids"):
            Plan.from_dict(broken)


def test_bind_worker_binds_main_and_pool_by_rank_and_reports_a_thread_that_is_gone():
    import threading

    from tuna_lab.live.binding import bind_worker

    cpus = sorted(os.sched_getaffinity(0))
    plan = Plan("by-hand", 1, 3, [[cpus, cpus[-1:], cpus[:1]]], range(max(cpus) + 1), "fp")
    done = threading.Event()
    helper = threading.Thread(target=done.wait, name="pool-stand-in")
    helper.start()
    try:
        # rank 1: a live thread of this process; rank 2: a TID no thread has
        bound = bind_worker(plan, 0, [helper.native_id, 2 ** 22 + 1])
        assert os.sched_getaffinity(helper.native_id) == set(cpus[-1:])
    finally:
        done.set()
        helper.join()
    assert [(b.role, b.rank, b.planned) for b in bound] == [
        ("main", 0, tuple(cpus)), ("pool", 1, tuple(cpus[-1:])), ("pool", 2, tuple(cpus[:1]))]
    assert bound[0].cpus == tuple(cpus) and bound[1].cpus == tuple(cpus[-1:]) and bound[1].error is None
    assert bound[2].cpus is None and "exited" in bound[2].error
    assert os.sched_getaffinity(0) == set(cpus)                 # the main thread kept its (whole) slot


# -- plans read and written safely -------------------------------------------------------------

@pytest.mark.parametrize("what", ["dev-zero", "fifo", "deep-file", "deep-text", "huge"])
def test_a_plan_that_is_no_file_or_too_big_or_deep_is_one_plan_error(what, tmp_path):
    if what == "dev-zero":
        source = "/dev/zero"
    elif what == "fifo":
        source = tmp_path / "fifo"
        os.mkfifo(source)                                  # opening it for reading must not wait for a writer
    elif what == "deep-file":
        source = tmp_path / "deep.json"
        source.write_text("[" * 100_000 + "]" * 100_000)
    elif what == "deep-text":
        source = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"    # TUNA_LAB_PLAN may hold the JSON itself
    else:
        source = tmp_path / "huge.json"
        with open(source, "wb") as fh:
            fh.truncate(64 << 20)                          # sparse: 64 MiB of zeros, no disk used
    with pytest.raises(PlanError) as caught:
        Plan.read(source)
    assert len(str(caught.value).splitlines()) == 1


def test_a_plan_is_written_over_a_link_never_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("someone's file\n")
    link = tmp_path / "plan.json"
    link.symlink_to(victim)
    plan = placement("round-robin", W, T, HERE).plan()
    plan.write(link)
    assert victim.read_text() == "someone's file\n"
    assert not link.is_symlink() and Plan.read(link) == plan
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "victim"]     # no temporary file left


def test_state_folders_of_dead_processes_are_removed_only_if_ours(tmp_path):
    import shutil
    import tempfile

    from tuna_lab.machine.procfs import start_ticks
    from tuna_lab.live.state import remove_dead_state

    with open("/proc/sys/kernel/pid_max") as fh:
        gone = int(fh.read())                              # PIDs are below pid_max: never a process
    root, me = tempfile.gettempdir(), os.geteuid()
    made = {
        "dead": f"tuna_lab-pin-{me}-{gone}-5", "dead-being-made": f"tuna_lab-pin-{me}-{gone}-5.x1y2",
        "recycled-pid": f"tuna_lab-pin-{me}-{os.getpid()}-{start_ticks(os.getpid()) + 1}",
        "alive": f"tuna_lab-pin-{me}-{os.getpid()}-{start_ticks(os.getpid())}",
        "alive-being-made": f"tuna_lab-pin-{me}-{os.getpid()}-{start_ticks(os.getpid())}.x1y2",
        "others-may-write": f"tuna_lab-pin-{me}-{gone}-6", "other-kind": f"tuna_lab-gunicorn-{me}-{gone}-5",
        "not-a-folder": f"tuna_lab-pin-{me}-{gone}-7",
    }
    paths = {k: os.path.join(root, v) for k, v in made.items()}
    try:
        for key, path in paths.items():
            if key == "not-a-folder":
                os.symlink(tmp_path, path)
                continue
            os.mkdir(path, 0o700)
            open(os.path.join(path, "masks.json"), "w").close()
        os.chmod(paths["others-may-write"], 0o777)
        remove_dead_state("pin", me)
        left = {key for key, path in paths.items() if os.path.lexists(path)}
        assert left == {"alive", "alive-being-made", "others-may-write", "other-kind", "not-a-folder"}
        assert tmp_path.is_dir()
        remove_dead_state("gunicorn", me)
        assert not os.path.lexists(paths["other-kind"])
    finally:
        for path in paths.values():
            if os.path.islink(path):
                os.unlink(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
