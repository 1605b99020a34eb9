"""Hostile paths, second pass (issue 46): nothing root writes or reads goes through what another user planted.

Every file a command names - ``bench``'s ``--out`` and ``--doc``, a results
folder, the model cache, a pidfile - goes through the one file layer
(:func:`tuna_lab._files.check_path` and the functions built on it): no link
another user could have planted anywhere on the path, no folder on the way
that another user owns or may write, no FIFO, no device, a size cap, and a
file that holds data is never taken for a pidfile. Each case asserts the
exit status, one line on stderr, no traceback, and that what lies outside
the user's own paths (a victim file or folder) is byte for byte as it was.

The other user is uid 65534 (nobody): as root, the test makes the planted
folder, link or file and hands it to that uid (``os.chown``/``os.lchown``),
which is what that user would have made. Those tests need root and are
skipped otherwise.
"""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import _deadline, main
from test_hostile import assert_refused, cli
from tuna_lab import _files
from tuna_lab.errors import ExperimentError, ServerError, UnsafeFileError

#: The other local user: nobody.
OTHER = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's files needs root")


def snapshot(path):
    """Everything under ``path`` (names, kinds, owners, modes, bytes): what must not change."""
    path = Path(path)
    out = {}
    for p in [path, *sorted(path.rglob("*"))] if path.is_dir() and not path.is_symlink() else [path]:
        st = os.lstat(p)
        data = p.read_bytes() if stat.S_ISREG(st.st_mode) else os.readlink(p) if p.is_symlink() else None
        out[str(p)] = (stat.S_IFMT(st.st_mode), st.st_uid, st.st_mode & 0o7777, data)
    return out


def one_line(result, code=2):
    """``result`` (helpers.main's) ended with ``code`` and one line on stderr, no traceback; that line."""
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code and len(lines) == 1, (result.returncode, result.stderr[-800:])
    assert lines[0].startswith("tuna-lab: "), lines
    return lines[0]


@pytest.fixture
def victim(tmp_path):
    """A root-only folder (0700) holding a file: what a planted link points at."""
    home = tmp_path / "roothome"
    (home / "secret").mkdir(parents=True)
    (home / "secret" / "data.txt").write_text("root's own data\n")
    (home / "notes.md").write_text("root's notes\n")
    home.chmod(0o700)
    return home


# -- bench: --out and --doc ------------------------------------------------------------------

def _bench(*args):
    # --relaxed-only --quick: the shortest bench (2 s), should a refusal ever come too late.
    return cli("bench", "solver", "--quick", "--relaxed-only", *map(str, args))


@pytest.mark.parametrize("which", ["--out", "--doc"])
def test_bench_refuses_to_write_through_a_link(tmp_path, victim, which):
    link = tmp_path / "link"
    link.symlink_to(victim / "notes.md")
    before = snapshot(victim)
    args = {"--out": tmp_path / "a.csv", "--doc": tmp_path / "a.md", which: link}
    p = _bench("--out", args["--out"], "--doc", args["--doc"])
    assert_refused(p)
    assert f"{which} {link} is a symbolic link" in p.err
    assert snapshot(victim) == before and link.is_symlink()
    assert not (tmp_path / "a.csv").exists() and not (tmp_path / "a.md").exists()    # refused before any work


@pytest.mark.parametrize("what, says", [("/dev/zero", "is a character device"), ("{t}/fifo", "is a FIFO"),
                                        ("{t}", "is a folder"), ("{t}/sparse", "is larger than"),
                                        ("{t}/binary", "is not UTF-8 text")])
def test_bench_refuses_a_device_fifo_or_folder_as_doc_at_once(tmp_path, what, says):
    # The last two: a report whose section would be replaced, read before the work, not after it.
    os.mkfifo(tmp_path / "fifo")
    with open(tmp_path / "sparse", "wb") as fh:                       # 8 GiB of nothing, on no disk
        fh.truncate(8 << 30)
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    doc = what.format(t=tmp_path)
    p = _bench("--out", tmp_path / "new" / "a.csv", "--doc", doc)
    assert_refused(p)
    assert p.elapsed < 20 and says in p.err, p.err
    # Nothing made: not the CSV, nor its folder.
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode) and not (tmp_path / "new").exists()


@pytest.mark.parametrize("out", ["/proc/version", "/proc/self/new.csv", "/dev/null"])
def test_bench_out_where_nothing_can_be_written_is_one_line(out):
    p = _bench("--out", out)
    assert_refused(p)
    assert p.err.startswith(f"tuna-lab: error: --out {out}")


def test_bench_doc_and_out_the_same_file_is_refused(tmp_path):
    same = tmp_path / "same.md"
    line = one_line(main("bench", "solver", "--quick", "--out", same, "--doc", same, timeout=30))
    assert "are the same file" in line and not same.exists()


def test_a_report_section_replaced_in_a_doc_is_read_by_the_file_layer(tmp_path):
    # The one read of a --doc: a section of it replaced. Whatever is planted there later is refused
    # (the file layer never reads through a link, nor a FIFO), and the text outside the section stays.
    from tuna_lab.bench import solver

    doc = tmp_path / "doc.md"
    doc.write_text(f"# Mine\n\nkept\n\n{solver._RELAXED_BEGIN}\nold\n{solver._RELAXED_END}\n\ntail\n")
    solver._replace_section(str(doc), solver._RELAXED_BEGIN, solver._RELAXED_END,
                            f"{solver._RELAXED_BEGIN}\nnew\n{solver._RELAXED_END}\n")
    assert doc.read_text() == f"# Mine\n\nkept\n\n{solver._RELAXED_BEGIN}\nnew\n{solver._RELAXED_END}\n\ntail\n"
    doc.unlink()
    os.mkfifo(doc)
    with pytest.raises(UnsafeFileError, match="is not a regular file"), _deadline(10, ["_replace_section"]):
        solver._replace_section(str(doc), solver._RELAXED_BEGIN, solver._RELAXED_END, "x")


# -- results folders: check_out and lock_folder -----------------------------------------------

def _plant(tmp_path, victim, how):
    """``m/out`` -> ``victim/secret``, planted ``how``; returns ``m/out``."""
    m = tmp_path / "m"
    m.mkdir()
    out = m / "out"
    out.symlink_to(victim / "secret")
    if how == "their folder":                    # m/ is theirs: so is every name in it
        os.chown(m, OTHER, OTHER)
        os.lchown(out, OTHER, OTHER)
    elif how == "their link in a sticky folder":     # like /tmp: they may add names, and this one is theirs
        m.chmod(0o1777)
        os.lchown(out, OTHER, OTHER)
    elif how == "a folder all may write":          # not sticky: they could have replaced our own link
        m.chmod(0o777)
    elif how == "their folder above":            # a folder of theirs further up the path
        os.chown(m, OTHER, OTHER)
        out = m / "out" / "."
    return out


HOW = ["their folder", "their link in a sticky folder", "a folder all may write", "their folder above"]


@as_root
@pytest.mark.parametrize("how", HOW)
def test_a_results_folder_through_another_users_link_is_refused(tmp_path, victim, how):
    from tuna_lab.measure.store import check_out, lock_folder

    out = _plant(tmp_path, victim, how)
    before = snapshot(victim)
    with pytest.raises(ExperimentError, match="another user|may be written by other users"):
        check_out(str(out), "--out")
    with pytest.raises(ExperimentError, match="another user|may be written by other users"):
        with lock_folder(str(out)):
            pass
    assert snapshot(victim) == before                   # no .tuna-lab.lock, no cell


@as_root
def test_run_into_a_planted_link_exits_2_and_writes_nothing(tmp_path, victim):
    out = _plant(tmp_path, victim, "their folder")
    before = snapshot(victim)
    # Refused before any server or model: an empty model cache would be trained into otherwise.
    p = cli("run", "-w", "1", "-t", "1", "--model", "small", "--batch", "1", "--requests", "5", "--trials", "1",
            "--policies", "cfs", "--out", out, env={"TUNA_LAB_CACHE": str(tmp_path / "cache")})
    assert_refused(p)
    assert "belongs to another user (uid 65534)" in p.err
    assert snapshot(victim) == before and not (tmp_path / "cache").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a link of root's own is only root's as root")
def test_a_link_of_our_own_in_our_own_folder_is_followed(tmp_path, victim):
    # Not over-strict: the user's own links (results kept on another disk) still work.
    from tuna_lab.measure.store import check_out, lock_folder

    (tmp_path / "disk").mkdir()
    (tmp_path / "results").symlink_to(tmp_path / "disk")
    assert check_out(str(tmp_path / "results" / "sweep")) == str(tmp_path / "results" / "sweep")
    with lock_folder(str(tmp_path / "results" / "sweep")):
        assert (tmp_path / "disk" / "sweep" / ".tuna-lab.lock").is_file()


def test_check_path_walks_links_and_dotdot_as_the_kernel_does(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "l").symlink_to(tmp_path / "a" / "b")
    # "l/.." is the parent of the link's target (a), not tmp_path, whatever abspath would say.
    real, st = _files.check_path(str(tmp_path / "l" / ".." / "x"))
    assert real == str(tmp_path / "a" / "x") and st is None
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(UnsafeFileError, match="too many symbolic links"):
        _files.check_path(str(tmp_path / "loop" / "x"))
    with pytest.raises(UnsafeFileError, match="is a symbolic link; refusing"):
        _files.check_path(str(tmp_path / "l"), link=False)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared").chmod(0o1777)
    assert _files.check_path(str(tmp_path / "shared" / "f"))[1] is None        # sticky: fine on the way
    with pytest.raises(UnsafeFileError, match="may be written by other users"):
        _files.check_path(str(tmp_path / "shared"))                             # but not to write in


# -- the model cache ---------------------------------------------------------------------------

def _tiny_model(path):
    """A real XGBoost model of 3 features, saved at ``path``."""
    import numpy as np

    from tuna_lab.server.models import import_xgboost

    xgboost = import_xgboost()
    booster = xgboost.train({"max_depth": 1, "nthread": 1}, xgboost.DMatrix(np.eye(4, 3), label=[0, 1, 0, 1]), 1)
    booster.save_model(str(path))


@as_root
@pytest.mark.parametrize("how", ["their folder", "their file", "their link to the cache"])
def test_a_model_another_user_planted_is_never_loaded(tmp_path, monkeypatch, how):
    from tuna_lab.server import models

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("TUNA_LAB_CACHE", str(cache))
    planted = models.model_path("small")
    _tiny_model(planted)
    if how == "their folder":
        os.chown(cache, OTHER, OTHER)
        os.chown(planted, OTHER, OTHER)
    elif how == "their file":
        os.chown(planted, OTHER, OTHER)
    else:
        (tmp_path / "theirs").mkdir()
        (tmp_path / "theirs" / "cache").symlink_to(cache)
        os.lchown(tmp_path / "theirs" / "cache", OTHER, OTHER)
        monkeypatch.setenv("TUNA_LAB_CACHE", str(tmp_path / "theirs" / "cache"))
    before = snapshot(tmp_path)
    with pytest.raises(ServerError, match="another user") as refused, _deadline(60, ["load_booster"]):
        models.load_booster("small", 1)
    assert "\n" not in str(refused.value)
    assert snapshot(tmp_path) == before                 # nothing trained over it, no lock file


@as_root
def test_run_with_another_users_model_cache_exits_2_before_any_trial(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, OTHER, OTHER)
    p = cli("run", "-w", "1", "-t", "1", "--model", "small", "--batch", "1", "--requests", "5", "--trials", "1",
            "--policies", "cfs", "--out", tmp_path / "out", env={"TUNA_LAB_CACHE": str(cache)})
    assert_refused(p)
    assert "model cache ($TUNA_LAB_CACHE)" in p.err and "belongs to another user (uid 65534)" in p.err
    assert not (tmp_path / "out").exists() and list(cache.iterdir()) == []


def test_a_model_of_our_own_loads_through_the_file_layer(tmp_path, monkeypatch):
    from tuna_lab.server import models

    monkeypatch.setenv("TUNA_LAB_CACHE", str(tmp_path))
    _tiny_model(models.model_path("small"))
    assert models.load_booster("small", 1).num_features() == 3          # the file there, read from memory


def test_a_fifo_in_the_model_cache_is_refused_at_once(tmp_path):
    # In a process of its own: before the fix, loading blocked for ever on the FIFO.
    code = ("import os, sys; from tuna_lab.server import models; from tuna_lab.errors import ServerError\n"
            "os.mkfifo(models.model_path('small'))\n"
            "try:\n    models.load_booster('small', 1)\nexcept ServerError as e:\n    sys.exit(str(e))\n")
    env = {**os.environ, "TUNA_LAB_CACHE": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-1000:]
    assert p.stderr.strip().endswith("is a FIFO, not a regular file; remove it") and p.stderr.count("\n") == 1


# -- pidfiles ----------------------------------------------------------------------------------

@pytest.mark.parametrize("content", ["important data\nline 2\n", "12ab\n", "1" * 100])
def test_serve_never_takes_a_file_that_holds_data_for_a_pidfile(tmp_path, content):
    f = tmp_path / "f"
    f.write_text(content)
    # --port 1: should the pidfile ever be taken, the start fails at once instead of serving.
    p = cli("serve", "-w", "1", "-t", "1", "--model", "small", "--port", "1", "--pidfile", f, "--detach",
            env={"TUNA_LAB_CACHE": str(tmp_path / "cache")})
    assert_refused(p)
    assert "holds something other than a process id" in p.err
    assert f.read_text() == content and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("plant", ["link", "fifo"])
def test_a_pidfile_that_is_a_link_or_fifo_is_refused(tmp_path, victim, plant):
    from tuna_lab.server.launch import Server

    f = tmp_path / "f.pid"
    if plant == "link":
        f.symlink_to(victim / "notes.md")
    else:
        os.mkfifo(f)
    before = snapshot(victim)
    with pytest.raises(ServerError, match="symbolic link|is a FIFO"), _deadline(10, ["Server"]):
        Server(1, 1, model="small", pidfile=str(f))
    assert snapshot(victim) == before


@as_root
def test_a_pidfile_in_another_users_folder_is_refused(tmp_path):
    from tuna_lab.server.launch import Server

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER, OTHER)
    with pytest.raises(ServerError, match=r"belongs to another user \(uid 65534\)"):
        Server(1, 1, model="small", pidfile=str(theirs / "s.pid"))
    assert list(theirs.iterdir()) == []


def test_a_stale_or_empty_pidfile_is_still_taken(tmp_path):
    from tuna_lab.server.launch import Server

    (tmp_path / "empty.pid").write_text("")
    (tmp_path / "stale.pid").write_text("4194303\n")        # pid_max's ceiling: no process has it
    for name in ("empty.pid", "stale.pid", "new.pid"):
        assert Server(1, 1, model="small", pidfile=str(tmp_path / name)).pidfile == str(tmp_path / name)


def test_stop_of_a_file_that_holds_data_deletes_nothing(tmp_path):
    f = tmp_path / "f"
    f.write_text("important data\n")
    line = one_line(main("stop", "--pidfile", f, timeout=30))
    assert "does not hold a process id" in line and f.read_text() == "important data\n"


def test_stop_removes_the_pidfile_that_names_the_server_it_stopped(tmp_path):
    # A process with our mark stands for a master whose Gunicorn was killed outright (it leaves its
    # pidfile): stop signals it, and removes the pidfile that names it - and nothing else.
    from tuna_lab.machine.procfs import start_ticks
    from tuna_lab.server import launch

    master = subprocess.Popen(["sleep", "60"], env={**os.environ, launch.SERVER_ID_VAR: "test-46"})
    try:
        pidfile = tmp_path / "s.pid"
        pidfile.write_text(f"{master.pid}\n")
        _files.write_json(f"{pidfile}.tuna.json", {
            "master": master.pid, "start_ticks": start_ticks(master.pid), "server_id": "test-46",
            "url": "http://127.0.0.1:1", "policy": "cfs", "workers": 1, "threads": 1, "model": "small",
            "own_state": False})
        done = launch.stop(str(pidfile), timeout=5)
        assert done["master"] == master.pid and master.wait(5) is not None
        assert not pidfile.exists() and not Path(f"{pidfile}.tuna.json").exists()
    finally:
        master.kill()
        master.wait()


@as_root
def test_a_request_log_folder_through_another_users_link_is_refused(tmp_path, victim):
    from tuna_lab.server.launch import Server

    logs = _plant(tmp_path, victim, "their folder")
    before = snapshot(victim)
    with pytest.raises(ServerError, match=r"--request-log .* belongs to another user \(uid 65534\)"):
        Server(1, 1, model="small", request_log=str(logs))
    assert snapshot(victim) == before
