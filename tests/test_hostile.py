"""Hostile input: every command refuses what another user or a careless hand may give it with one line.

Each case runs the real CLI in a subprocess under a 4 GB address-space cap
and a 30 s limit, with inputs a local attacker or a typo can produce: FIFOs
(an ``open`` that waits for ever for a writer), ``/dev/zero`` (a read that
never ends), a sparse file of gigabytes, JSON nested 100,000 deep, ids and
sizes far beyond any machine, symbolic links where we write, corrupt
records. Every one must end within the limit with exit 2 (refused before
anything ran) or 1 (ran and failed), one line on stderr that starts with
``tuna-lab:``, and no traceback.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

#: The address-space cap every case runs under: a MemoryError or an allocation of tens of GB is a failure.
AS_LIMIT = 4 * 1024 ** 3
TIMEOUT = 30


def _cap():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def cli(*args, env=None, timeout=TIMEOUT):
    """The CLI run as a user runs it; a hang past ``timeout`` is a failure, not a skip."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TUNA_LAB_")}
    environ.update(env or {})
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tuna_lab", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ,
                            preexec_fn=_cap, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"hung for {timeout} s: tuna-lab {' '.join(args)}")
    proc.elapsed = time.monotonic() - start
    proc.out, proc.err = out, err
    return proc


def assert_refused(proc, codes=(2,)):
    """One line on stderr, ``tuna-lab: ...``; the exit status is one of ``codes``; no traceback."""
    assert "Traceback" not in proc.err, proc.err[-2000:]
    lines = [line for line in proc.err.splitlines() if line.strip()]
    assert proc.returncode in codes, (proc.returncode, proc.err[-800:])
    assert len(lines) >= 1 and lines[-1].startswith("tuna-lab"), proc.err[-800:]
    if 2 in codes and proc.returncode == 2:
        # Refused before anything ran: nothing but the one line.
        assert len(lines) == 1, proc.err


@pytest.fixture(scope="module")
def hazards(tmp_path_factory):
    """A folder of planted things: FIFOs, deep JSON, huge sparse files, links, absurd hwloc XML."""
    d = tmp_path_factory.mktemp("hazards")
    os.mkfifo(d / "fifo")
    deep = "[" * 100_000 + "]" * 100_000
    (d / "deep.json").write_text(deep)
    (d / "deep-plan.json").write_text('{"policy": ' + deep + "}")
    (d / "deep.jsonl").write_text(deep + "\n")
    with open(d / "sparse", "wb") as fh:                       # 8 GiB of nothing, on no disk
        fh.truncate(8 << 30)
    (d / "garbage.json").write_text("{not json")
    (d / "body.json").write_text('{"rows": [[0.5, 0.25]]}')
    # hwloc XML: 20,000 PUs (a distance matrix of 3.2 GB), an os_index beyond any CPU id, a billion laughs.
    pus = "".join(f'<object type="PU" os_index="{i}"/>' for i in range(20_000))
    (d / "pus.xml").write_text(f'<?xml version="1.0"?><topology><object type="Machine" os_index="0">'
                               f'<object type="Package" os_index="0"><object type="Core" os_index="0">{pus}'
                               "</object></object></object></topology>")
    (d / "bigid.xml").write_text('<?xml version="1.0"?><topology><object type="Machine" os_index="0">'
                                 '<object type="Package" os_index="0"><object type="Core" os_index="0">'
                                 '<object type="PU" os_index="4000000000"/></object></object></object></topology>')
    lol = "".join(f'<!ENTITY l{i} "{("&l" + str(i - 1) + ";") * 10}">' for i in range(1, 10))
    (d / "laughs.xml").write_text(f'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY l0 "lol">{lol}]>'
                                  '<topology><object type="Machine" os_index="&l9;"/></topology>')
    # Filesystem roots whose `online` is /dev/zero, a FIFO, or a huge sparse file.
    for name, plant in (("root-zero", lambda p: os.symlink("/dev/zero", p)), ("root-fifo", os.mkfifo),
                        ("root-sparse", lambda p: open(p, "wb").truncate(1 << 30))):
        cpu = d / name / "sys" / "devices" / "system" / "cpu"
        cpu.mkdir(parents=True)
        plant(cpu / "online")
        (cpu / "possible").write_text("0-1\n")
        (cpu / "present").write_text("0-1\n")
    # Pidfiles a user could leave: a negative pid, a huge one, garbage, a FIFO, /dev/zero.
    (d / "neg.pid").write_text("-1\n")
    (d / "huge.pid").write_text("99999999999999999999999999\n")
    (d / "garbage.pid").write_text("\x00\x01abc\n")
    os.symlink("/dev/zero", d / "zero.pid")
    return d


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    """A real results folder: one small run of the lab server (a few seconds)."""
    out = tmp_path_factory.mktemp("results")
    p = cli("run", "-w", "1", "-t", "1", "--model", "small", "--batch", "10", "--policies", "cfs,round-robin",
            "--trials", "1", "--requests", "20", "--out", str(out / "r"), timeout=300)
    assert p.returncode == 0, p.err[-2000:]
    return out / "r"


def _corrupt(cell, tmp_path, how):
    """A copy of ``cell``'s results with its manifest corrupted ``how``."""
    dest = tmp_path / "corrupt"
    shutil.copytree(cell, dest, ignore=shutil.ignore_patterns(".tuna-lab.lock"))
    (manifest,) = dest.glob("*/manifest.json")
    if how == "fifo":
        manifest.unlink()
        os.mkfifo(manifest)
    elif how == "deep":
        manifest.write_text("[" * 100_000 + "]" * 100_000)
    elif how == "zero":
        manifest.unlink()
        os.symlink("/dev/zero", manifest)
    else:
        data = json.loads(manifest.read_text())
        data["valid_trials"] = how
        manifest.write_text(json.dumps(data))
    return dest


# -- readers of machines ------------------------------------------------------------------------
READERS = [
    ("topology", "--hwloc-xml", "{h}/fifo"),
    ("topology", "--hwloc-xml", "/dev/zero"),
    ("topology", "--hwloc-xml", "{h}/sparse"),
    ("topology", "--hwloc-xml", "{h}/pus.xml"),
    ("topology", "--hwloc-xml", "{h}/bigid.xml"),
    ("topology", "--hwloc-xml", "{h}/laughs.xml"),
    ("topology", "--hwloc-xml", "{h}/deep.json"),
    ("topology", "--hwloc-xml", "{h}"),
    ("topology", "--fsroot", "{h}/root-zero"),
    ("topology", "--fsroot", "{h}/root-fifo"),
    ("topology", "--fsroot", "{h}/root-sparse"),
    ("topology", "--fsroot", "{h}/fifo"),
    ("topology", "--fsroot", "/dev/zero"),
    ("topology", "--synthetic", "core:60000 pu:1"),
    ("topology", "--synthetic", "pack:100000 core:100000 pu:100000"),
    ("topology", "--synthetic", "core:99999999999999999999999 pu:1"),
    ("solve", "-w", "2", "-t", "1", "--hwloc-xml", "{h}/bigid.xml"),
    ("solve", "-w", "2", "-t", "1", "--fsroot", "{h}/root-fifo"),
    ("plan", "-w", "2", "-t", "1", "--policy", "round-robin", "--hwloc-xml", "{h}/pus.xml"),
]

# -- sizes: workers, threads, batch, ids ---------------------------------------------------------
SIZES = [
    ("solve", "-w", "1000000000", "-t", "1"),
    ("solve", "-w", "2", "-t", "99999999999999999999"),
    ("solve", "-w", "100000", "-t", "100000", "--preset", "xeon-8272cl"),
    ("solve", "-w", "2", "-t", "2", "--time-limit", "nan"),
    ("solve", "-w", "2", "-t", "2", "--gap", "inf"),
    ("plan", "-w", "1000000000", "-t", "1", "--policy", "round-robin"),
    ("advise", "-w", "1000000000", "-t", "1"),
    ("run", "-w", "1", "-t", "1", "--batch", "1000000000"),
    ("run", "-w", "1", "-t", "1", "--spincount", "1" + "0" * 30),
    ("run", "-w", "1000000000", "-t", "1"),
    ("run", "-w", "1", "-t", "1", "--requests", "0"),
    ("run", "-w", "1", "-t", "1", "--concurrency", "0"),
    ("run", "-w", "1", "-t", "1", "--rate", "nan", "--duration", "1"),
    ("run", "-w", "1", "-t", "1", "--client-cpus", "99999"),
    ("run", "-w", "1", "-t", "1", "--max-error-rate", "2"),
    ("serve", "-w", "1000000000", "-t", "1"),
    ("serve", "-w", "1", "-t", "1", "--port", "70000"),
    ("sweep", "--configs", "1000000000x1", "--out", "{t}/s"),
    ("sweep", "--configs", "1x1", "--batches", "1000000000", "--out", "{t}/s"),
    ("sweep", "--configs", "1x1", "--concurrency", "0", "--out", "{t}/s"),
    ("sweep", "--configs", "1x1", "--budget", "1ms", "--out", "{t}/s"),
    ("sweep", "--configs", "1x1", "--models", "", "--out", "{t}/s"),
    ("tune", "--sla-p99", "0ms", "--budget", "60s"),
    ("tune", "--sla-p99", "nanms", "--budget", "60s"),
    ("tune", "--sla-p99", "1e400ms", "--budget", "60s"),
    ("tune", "--sla-p99", "100ms", "--budget", "1ms"),
]

# -- processes ------------------------------------------------------------------------------------
PROCESSES = [
    ("pin", "--pid", "1", "-t", "1", "--policy", "round-robin"),
    ("pin", "--pid", "99999999999999", "-t", "1", "--policy", "round-robin"),
    ("pin", "--pid", "-5", "-t", "1", "--policy", "round-robin"),
    ("pin", "--pid", "{shell}", "-t", "1", "--policy", "round-robin"),
    ("pin", "--pid", "{shell}", "--plan", "/dev/zero"),
    ("pin", "--pid", "{shell}", "--plan", "{h}/fifo"),
    ("pin", "--pid", "{shell}", "--plan", "{h}/deep-plan.json"),
    ("pin", "--pid", "{shell}", "--plan", "{h}/sparse"),
    ("unpin", "--pid", "0"),
    ("status", "--pid", "4294967296"),
    ("status", "--pid", "1", "--plan", "{h}/deep-plan.json"),
    ("plan", "-w", "1", "-t", "1", "--policy", "round-robin", "--format", "taskset", "--pid", "1"),
    ("plan", "-w", "1", "-t", "1", "--policy", "round-robin", "--format", "taskset", "--pid", "{shell}"),
    ("stop", "--pidfile", "{h}/neg.pid"),
    ("stop", "--pidfile", "{h}/huge.pid"),
    ("stop", "--pidfile", "{h}/garbage.pid"),
    ("stop", "--pidfile", "{h}/fifo"),
    ("stop", "--pidfile", "{h}/zero.pid"),
    ("status", "--pidfile", "{h}/fifo"),
    ("serve", "-w", "1", "-t", "1", "--pidfile", "/nonexistent/d/p.pid"),
    ("serve", "-w", "1", "-t", "1", "--request-log", "/proc/1/x"),
    ("serve", "-w", "1", "-t", "1", "--pidfile", "{h}/fifo"),
]

# -- targets and bodies -----------------------------------------------------------------------------
TARGETS = [
    ("run", "--app", "../../etc:passwd", "--out", "{t}/r"),
    ("run", "--app", "os:system", "--app-dir", "{h}/fifo", "--out", "{t}/r"),
    ("run", "--pid", "1", "--url", "http://example.com/", "-t", "1", "--out", "{t}/r"),
    ("run", "--pid", "{shell}", "--url", "http://127.0.0.1:9/", "-t", "1", "--body", "{h}/fifo", "--out", "{t}/r"),
    ("run", "--pid", "{shell}", "--url", "http://127.0.0.1:9/", "-t", "1", "--body", "/dev/zero", "--out", "{t}/r"),
    ("run", "--pid", "{shell}", "--url", "http://127.0.0.1:9/", "-t", "1", "--bodies", "{h}/deep.jsonl",
     "--out", "{t}/r"),
    ("run", "--pid", "{shell}", "--url", "http://127.0.0.1:9/", "-t", "1", "--bodies", "{h}/sparse",
     "--out", "{t}/r"),
    ("run", "--app", "x:app", "--server-conf", "{h}/fifo", "--out", "{t}/r"),
    ("sweep", "--cluster", "tcp://[::zz", "--configs", "1x1", "--out", "{t}/s"),
]

CASES = [pytest.param(c, id=" ".join(c)[:70]) for c in READERS + SIZES + PROCESSES + TARGETS]


@pytest.fixture(scope="module")
def shell():
    """A process with two children that is no server: a shell and two sleeps."""
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 300 & sleep 300 & wait"], start_new_session=True)
    time.sleep(0.3)
    yield proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("args", CASES)
def test_hostile_input_is_one_line(args, hazards, shell, tmp_path):
    argv = [a.format(h=hazards, t=tmp_path, shell=shell) for a in args]
    assert_refused(cli(*argv), codes=(1, 2))
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").glob("w*"))


# -- records: corrupt results, links where we write ----------------------------------------------------
@pytest.mark.parametrize("how", ["abc", None, -1, 1e300, "fifo", "deep", "zero"])
@pytest.mark.parametrize("command", ["report", "advise"])
def test_a_corrupt_manifest_is_one_line(cell, tmp_path, how, command):
    folder = _corrupt(cell, tmp_path, how)
    args = ["report", str(folder), "-o", str(tmp_path / "r.html")] if command == "report" else \
        ["advise", "-w", "1", "-t", "1", "--model", "small", "--batch", "10", str(folder)]
    assert_refused(cli(*args), codes=(1, 2))


@pytest.mark.parametrize("output", ["/proc/version", "{t}", "{t}/file/r.html", "/proc/self/r.html"])
def test_report_to_a_path_it_cannot_write_is_one_line(cell, tmp_path, output):
    (tmp_path / "file").write_text("a file, not a folder")
    assert_refused(cli("report", str(cell), "-o", output.format(t=tmp_path)))


@pytest.mark.parametrize("what", ["/dev/zero", "{h}/fifo", "{h}/sparse", "{h}"])
def test_report_of_something_that_is_no_results_folder_is_one_line(hazards, what):
    assert_refused(cli("report", what.format(h=hazards)))


def test_a_report_written_over_a_planted_link_replaces_the_link_not_its_target(cell, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    victim.chmod(0o600)
    os.symlink(victim, tmp_path / "r.html")
    p = cli("report", str(cell), "-o", str(tmp_path / "r.html"))
    assert p.returncode == 0, p.err
    assert victim.read_text() == "precious"
    assert not (tmp_path / "r.html").is_symlink()


def test_a_results_folder_whose_lock_is_a_link_is_refused(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (tmp_path / "victim").write_text("precious")
    os.symlink(tmp_path / "victim", out / ".tuna-lab.lock")
    assert_refused(cli("run", "-w", "1", "-t", "1", "--model", "small", "--requests", "5", "--out", str(out)))
    assert (tmp_path / "victim").read_text() == "precious"


def test_a_sweep_resumed_over_a_corrupt_cell_redoes_it_or_refuses(cell, tmp_path):
    """Never "all finished" over a cell whose manifest cannot be read."""
    folder = _corrupt(cell, tmp_path, "abc")
    p = cli("sweep", "--configs", "1x1", "--models", "small", "--batches", "10", "--policies", "cfs,round-robin",
            "--trials", "1", "--requests", "20", "--out", str(folder), timeout=300)
    assert "Traceback" not in p.err
    if p.returncode == 0:
        report = cli("report", str(folder), "-o", str(tmp_path / "r.html"))
        assert report.returncode == 0, report.err
    else:
        assert_refused(p, codes=(1, 2))


def test_a_planted_lock_fifo_does_not_hang_a_measurement(tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    for cpu in os.sched_getaffinity(0):
        os.mkfifo(locks / f"cpu{cpu}.lock")
    p = cli("run", "-w", "1", "-t", "1", "--model", "small", "--requests", "5", "--policies", "cfs",
            "--out", str(tmp_path / "r"), env={"TUNA_LAB_LOCK_DIR": str(locks), "TUNA_LAB_CPU_LOCK_WAIT": "5"})
    assert_refused(p, codes=(1, 2))
    assert p.elapsed < 25
