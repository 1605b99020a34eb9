"""The load generator's CPUs: chosen, kept free of every policy, recorded in every trial.

The choice is a pure function of a topology and its usable CPUs, tested on
the presets, synthetic machines and hwloc's dumps (this machine has 2 CPUs,
too few for the default to reserve anything). The end-to-end part runs real
servers here with CPU 1 kept for the generator and watches, from /proc,
every thread of every server while the run goes on.
"""

import os
import threading
import time
import warnings

import pytest

from helpers import cli, main
from tuna_lab._checks import format_cpulist, parse_cpulist
from tuna_lab.errors import ExperimentError, TopologyError
from tuna_lab.machine import Limits, Topology
from tuna_lab.machine.reserve import MIN_CPUS_TO_RESERVE, ClientCpus, reserve_client_cpus
from tuna_lab.placement.policies import POLICIES, placement

CPUS = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="keeping a CPU for the generator needs two")


def whole_core(topo, cpus):
    """Whether ``cpus`` are exactly the logical cores of one physical core of ``topo``."""
    index = [topo.cpus.index(c) for c in cpus]
    cores = {int(topo.core[i]) for i in index}
    return len(cores) == 1 and sorted(cpus) == sorted(c for c, k in zip(topo.cpus, topo.core) if k in cores)


# ------------------------------------------------------------------ the choice, on machines we do not have
@pytest.mark.parametrize("name, expected", [
    ("xeon-8272cl", (15, 31)),        # the article's machine: core 15 and its SMT sibling
    ("xeon-8260-2s", (47, 95)),       # the last core of the second socket
    ("epyc-7313p", (15, 31)),
    ("epyc-9654-2s", (191, 383)),
])
def test_the_default_keeps_one_physical_core_from_8_cpus(name, expected):
    topo = Topology.preset(name)
    split = reserve_client_cpus(topology=topo)
    assert split.cpus == expected and split.how == "default" and split.reserved
    assert whole_core(topo, split.cpus) and 0 not in split.cpus
    assert set(split.server.cpus) == set(topo.cpus) - set(expected)
    assert split.cpulist in split.describe() and "by default" in split.describe()


@pytest.mark.parametrize("spec, reserved", [
    ("core:7 pu:1", ()),                           # 7 CPUs: below the threshold, nothing kept
    ("core:8 pu:1", (7,)),                         # exactly 8: one core, the last
    ("pack:2 core:4 pu:1", (7,)),
    ("pack:2 core:2 pu:2", (6, 7)),                # hwloc numbers PUs core by core: the last core is PUs 6-7
    ("core:3 pu:2", ()),                           # 6 CPUs
])
def test_the_threshold_is_8_usable_cpus(spec, reserved):
    topo = Topology.synthetic(spec)
    split = reserve_client_cpus(topology=topo)
    assert split.cpus == reserved and (not reserved or whole_core(topo, reserved))
    assert (topo.n_logical >= MIN_CPUS_TO_RESERVE) == split.reserved
    if not reserved:
        line = split.describe()
        assert "shares the server's CPUs" in line and "--client-cpus" in line and "\n" not in line
        assert split.server.cpus == topo.cpus


def test_the_rule_counts_the_cpus_this_process_may_really_use():
    topo = Topology.preset("xeon-8272cl")
    # A CPU quota of 4 CPUs: a core of its own would not keep the generator's time from the server's quota.
    assert reserve_client_cpus(topology=topo, limits=Limits(online=tuple(range(32)), quota=4.0)).cpus == ()
    # An affinity of 8 CPUs with no SMT sibling among them: the last of those, whole core as far as usable.
    split = reserve_client_cpus(topology=topo, limits=Limits(online=tuple(range(32)), affinity=tuple(range(8))))
    assert split.cpus == (7,) and split.server.cpus == tuple(range(7))
    with pytest.raises(TopologyError, match="not usable"):
        reserve_client_cpus("20", topology=topo, limits=Limits(online=tuple(range(32)), affinity=tuple(range(8))))


@pytest.fixture(scope="module")
def dump_roots(hwloc_dump_roots):
    return hwloc_dump_roots


def test_on_hwloc_dumps_the_default_is_one_whole_core_of_the_last_package_never_cpu_0(dump_roots):
    checked = 0
    for name, root in dump_roots.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            topo, limits = Topology.from_fsroot(root), Limits.read(root)
        split = reserve_client_cpus(topology=topo, limits=limits)
        usable = sorted(set(topo.cpus) & set(limits.usable))
        if limits.effective_cpus < MIN_CPUS_TO_RESERVE:
            assert split.cpus == (), name
            continue
        machine = topo.restrict(usable)
        assert split.cpus and 0 not in split.cpus and whole_core(machine, split.cpus), name
        # ... of the last package: no usable CPU of a later package exists.
        package = {int(machine.package[machine.cpus.index(c)]) for c in split.cpus}
        assert package == {int(machine.package.max())}, name
        assert sorted(set(split.server.cpus) | set(split.cpus)) == usable, name
        assert not set(split.server.cpus) & set(split.cpus), name
        checked += 1
    assert checked >= 15
    # one case by hand: 4 sockets x 2 cores x 2 threads, siblings numbered x and x+8
    assert reserve_client_cpus(topology=Topology.from_fsroot(dump_roots["16em64t-4s2c2t"])).cpus == (7, 15)


@pytest.mark.parametrize("spec", ["none", "NONE", " none "])
def test_none_keeps_nothing_even_on_a_big_machine(spec):
    split = reserve_client_cpus(spec, topology=Topology.preset("epyc-9654"))
    assert split.cpus == () and split.how == "none" and split.server.n_logical == 192
    assert "--client-cpus none" in split.describe()


@pytest.mark.parametrize("spec, message", [
    ("64", "CPU 64 is not usable"),
    ("0-31", "leaves no CPU for the server"),
    ("1-", "bad cpulist"),
    ("", "wants a cpulist"),
    ([-1], "non-negative"),
])
def test_bad_client_cpus_raise_the_callers_error(spec, message):
    with pytest.raises(ExperimentError, match=message):
        reserve_client_cpus(spec, topology=Topology.preset("xeon-8272cl"), error=ExperimentError)


def test_too_few_cpus_left_for_a_worker_pool():
    split = reserve_client_cpus("2-3", topology=Topology.synthetic("core:4 pu:1"))
    assert split.check_threads(2) is split
    with pytest.raises(ExperimentError, match="3 threads per worker need 3 CPUs"):
        split.check_threads(3, ExperimentError)
    # Nothing kept: the server's own check (XGBoost's cap) applies, not this one.
    reserve_client_cpus("none", topology=Topology.synthetic("core:2 pu:1")).check_threads(5)


@pytest.mark.parametrize("policy", POLICIES)
def test_no_policy_places_a_thread_on_a_client_cpu(policy):
    topo = Topology.synthetic("pack:2 core:4 pu:2")
    split = reserve_client_cpus(topology=topo)
    assert split.cpus == (14, 15)         # hwloc's synthetic numbering: the last core is PUs 14-15
    got = placement(policy, 3, 4, split.server, time_limit=60)
    used = set().union(*(cpus for row in got.allowed for cpus in row))
    assert used and not used & set(split.cpus), policy
    if policy == "cfs":
        assert used == set(split.server.cpus)


def test_a_split_is_returned_as_is_and_records_itself():
    split = reserve_client_cpus("1", topology=Topology.synthetic("core:2 pu:1"))
    assert isinstance(split, ClientCpus) and reserve_client_cpus(split) is split
    assert split.to_dict() == {"cpus": [1], "cpulist": "1", "how": "given", "server_cpus": [0], "usable": 2,
                               "note": split.describe()}


def test_this_machine_below_8_cpus_keeps_nothing_by_default():
    split = reserve_client_cpus()
    if Limits.read().effective_cpus >= MIN_CPUS_TO_RESERVE:
        pytest.skip("this machine is big enough for the default to keep a core")
    assert split.cpus == () and set(split.server.cpus) == set(CPUS)


# ------------------------------------------------------------------ real servers, CPU 1 kept
def _watch_server_threads(stop, seen):
    """Until ``stop``: every thread of every Gunicorn process below this one -> its allowed CPUs and last CPU."""
    import psutil

    me = psutil.Process()
    while not stop.is_set():
        for proc in me.children(recursive=True):
            try:
                if "gunicorn" not in " ".join(proc.cmdline()):
                    continue    # a fork not yet exec'd (the runner's copy) is not the server
                for task in os.listdir(f"/proc/{proc.pid}/task"):
                    with open(f"/proc/{proc.pid}/task/{task}/status") as fh:
                        allowed = next(line.split(":", 1)[1] for line in fh if line.startswith("Cpus_allowed_list"))
                    with open(f"/proc/{proc.pid}/task/{task}/stat") as fh:
                        last_cpu = int(fh.read().rsplit(")", 1)[1].split()[36])
                    seen.append((proc.pid, int(task), parse_cpulist(allowed), last_cpu))
            except (OSError, StopIteration, psutil.Error):
                continue        # a thread or process that ended while being read
        time.sleep(0.02)


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """A real run, W=1 T=1, cfs / round-robin / tuna-scatter, with CPU 1 kept for the generator, watched."""
    from tuna_lab.measure.experiment import Config, LoadSpec, TrialSpec, run

    if len(CPUS) < 2:
        pytest.skip("keeping a CPU for the generator needs two")
    client = CPUS[-1]
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch_server_threads, args=(stop, seen), daemon=True)
    watcher.start()
    lines = []
    try:
        result = run(Config(1, 1, "small", 10), ["cfs", "round-robin", "tuna-scatter"], trials=1,
                     load=LoadSpec(60, concurrency=4), trial=TrialSpec(client_cpus=str(client)), progress=lines.append,
                     out=str(tmp_path_factory.mktemp("kept") / "cell"))
    finally:
        stop.set()
        watcher.join(5)
    return result, client, seen, lines


@needs_two_cpus
def test_no_server_thread_is_ever_on_the_client_cpu(kept):
    result, client, seen, _ = kept
    assert (result.trials["trial_status"] == "ok").all(), result.trials["reason"].tolist()
    masters = {pid for pid, *_ in seen}
    assert len(masters) >= 3 * 2          # three servers, each a master and a worker, were watched
    assert not [s for s in seen if client in s[2]], "a server thread was allowed on the client CPU"
    assert not [s for s in seen if s[3] == client], "a server thread ran on the client CPU"
    # ... and what the runner recorded says the same.
    assert set(result.trials["server_cpus"]) == {format_cpulist(set(CPUS) - {client})}
    assert result.threads is not None and client not in set().union(
        *(parse_cpulist(c) for c in result.threads["cpus"]))


@needs_two_cpus
def test_the_generator_ran_exactly_on_the_client_cpu_and_says_what_it_cost(kept):
    result, client, _, lines = kept
    trials = result.trials
    assert set(trials["generator_cpus"]) == {str(client)}
    assert (trials["generator_cpu_seconds"] > 0).all()
    assert (trials["generator_cpu_seconds"] - trials["generator_cpu_user"] - trials["generator_cpu_sys"]).abs().max() \
        < 1e-9
    per = trials["generator_cpu_seconds"] / trials["n"]
    assert trials["generator_cpu_per_request"].to_numpy() == pytest.approx(per.to_numpy())
    assert (trials["generator_processes"] >= 1).all() and (trials["generator_wall_seconds"] > 0).all()
    assert (trials["cpus"] == len(CPUS) - 1).all()          # the server's C is what it was left
    meta = result.manifest
    assert meta["client_cpus"]["cpus"] == [client] and meta["client_cpus"]["how"] == "given"
    assert meta["generator"]["cpu_seconds"] == pytest.approx(trials["generator_cpu_seconds"].sum())
    assert meta["generator"]["requests"] == 3 * 60 and meta["generator"]["cpu_per_request"] > 0
    assert meta["client_cpus"]["note"].startswith(f"load generator on CPU {client} ")
    assert all("trial" in line for line in lines)          # progress reports trials only
    # Nothing of this process stays pinned once the run is over.
    for task in os.listdir("/proc/self/task"):
        assert os.sched_getaffinity(int(task)) == set(CPUS)


@needs_two_cpus
def test_a_pool_that_no_longer_fits_is_refused_before_any_server_starts():
    from tuna_lab.measure.experiment import Config, LoadSpec, TrialSpec, run

    with pytest.raises(ExperimentError, match="threads per worker need"):
        run(Config(1, len(CPUS), "small", 10), ["cfs"], trials=1, load=LoadSpec(5),
            trial=TrialSpec(client_cpus=str(CPUS[-1])))


# ------------------------------------------------------------------ the command line
# In this process (helpers.main), but for `serve --detach`: the server it leaves running is a process's.
@pytest.mark.parametrize("command", [
    ("run", "-w", "1", "-t", "1", "--model", "small"),
    ("sweep", "--configs", "1x1", "--models", "small", "--out", "{tmp}/s"),
    ("serve", "-w", "1", "-t", "1", "--model", "small", "--port", "0"),
])
@pytest.mark.parametrize("value, message", [
    ("999", "not usable"),
    (",".join(map(str, CPUS)), "leaves no CPU"),
    ("1-x", "bad cpulist"),
    ("", "wants a cpulist"),
])
def test_bad_client_cpus_are_one_line_and_exit_2(command, value, message, tmp_path):
    p = main(*[a.replace("{tmp}", str(tmp_path)) for a in command], "--client-cpus", value)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuna-lab: error: ") and message in lines[0], p.stderr


@needs_two_cpus
def test_a_pool_larger_than_the_cpus_left_is_one_line_and_exit_2():
    p = main("run", "-w", "1", "-t", len(CPUS), "--model", "small", "--client-cpus", CPUS[-1])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "threads per worker need" in p.stderr


@needs_two_cpus
def test_run_with_client_cpus_prints_server_and_generator_cpu_per_request():
    client = CPUS[-1]
    p = main("run", "-w", "1", "-t", "1", "--model", "small", "--batch", "10", "--policies", "cfs", "--trials", "1",
            "--requests", "20", "--concurrency", "4", "--client-cpus", client)
    assert p.returncode == 0, p.stderr
    said = [line for line in p.stderr.splitlines() if "load generator" in line]
    assert said == [f"tuna-lab: load generator on CPU {client} (--client-cpus); the server places on "
                    f"{format_cpulist(set(CPUS) - {client})}"]
    header, cfs = p.stdout.splitlines()[:2]
    assert "server CPU ms/req" in header and header.endswith("generator CPU ms/req")
    assert float(cfs.split()[-1]) > 0                       # the generator's ms per request
    assert "nan" not in cfs                                 # T=1: no OpenMP team, its idle share is "-"


@needs_two_cpus
def test_serve_keeps_the_server_off_the_client_cpus_and_status_shows_it(tmp_path):
    import json

    client = CPUS[-1]
    pidfile = tmp_path / "srv.pid"
    p = cli("serve", "-w", "2", "-t", "1", "--model", "small", "--policy", "cfs", "--port", "0",
            "--pidfile", pidfile, "--client-cpus", client, "--detach", timeout=300)
    try:
        assert p.returncode == 0, p.stderr
        assert f"load generator on CPU {client} (--client-cpus)" in p.stderr
        assert f"CPU {client} kept free for your load generator" in p.stdout
        status = main("status", "--pidfile", pidfile, "--json")
        info = json.loads(status.stdout)
        server = [c for c in CPUS if c != client]
        assert info["server_cpus"] == server and info["master_cpus"] == server
        threads = [t for w in info["workers"] for t in w["threads"]]
        assert len(info["workers"]) == 2 and threads
        assert all(t["cpus"] == server for t in threads)     # cfs binds nothing, yet stays off the client CPU
        text = main("status", "--pidfile", pidfile).stdout
        assert "server confined to CPUs" in text
    finally:
        if pidfile.exists():
            cli("stop", "--pidfile", pidfile, timeout=60)
