"""The helpers every test file shares: the CLI (in this process, or as a process), server process groups, the user's model.

* :func:`main` runs ``tuna-lab ARGS`` in this process (``tuna_lab.cli.main``)
  and returns what a process would have given: the exit status, stdout and
  stderr. Use it wherever the test is about what a command does, not about
  the process: it costs no interpreter start and no imports.
* :func:`cli` runs ``python -m tuna_lab ARGS`` as a process, for the tests
  where the process is under test: the real entry point's exit status, a
  signal, a resource limit, a process the test kills.
* :class:`ProcessGroup` is a server process tree started in its own session
  and stopped as one group.
* :func:`train_user_model` trains tests/userapp's model (conftest's
  session fixtures ``user_model`` and ``model_env`` train it once).
* :func:`simulated_race` is a tune race target on a simulated clock.
"""

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

#: A user's own apps (WSGI, ASGI, with and without Server-Timing) and their model's recipe.
USERAPP = Path(__file__).parent / "userapp"


@dataclass
class Result:
    """What a ``tuna-lab`` run gave: the fields of :class:`subprocess.CompletedProcess` the tests read."""

    args: list
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _environment(env, cwd):
    """``os.environ`` is ``env`` (when given) and the working directory ``cwd`` (when given), for the block only."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in env.items()})
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


class Hung(BaseException):
    """A command run by :func:`main` outlived its timeout (a BaseException: no ``except Exception`` takes it)."""


@contextlib.contextmanager
def _deadline(seconds, argv):
    """Raise :class:`Hung` in the main thread after ``seconds``: a hang is a failure, as under a process's timeout."""
    def expired(signum, frame):
        raise Hung(f"tuna-lab {' '.join(argv)}: still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def main(*args, env=None, cwd=None, stdin="", timeout=600):
    """``tuna-lab ARGS`` run in this process by ``tuna_lab.cli.main``; returns a :class:`Result`.

    ``env`` replaces the environment (as ``subprocess.run(env=...)`` would)
    and ``cwd`` the working directory, both for this call only; ``stdin`` is
    what the command reads on its standard input. argparse's exits (bad
    usage, ``--help``) are exit statuses here, as they are in a process. A
    command still running after ``timeout`` seconds fails the test
    (:class:`Hung`) rather than hang the session.
    """
    from tuna_lab.cli import main as tuna_lab

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    try:
        with _environment(env, cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                _deadline(timeout, argv):
            sys.stdin = io.StringIO(stdin)
            try:
                code = tuna_lab(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
    finally:
        sys.stdin = saved_stdin
    return Result(argv, 0 if code is None else code, out.getvalue(), err.getvalue())


def cli(*args, env=None, cwd=None, timeout=300, module="tuna_lab"):
    """``python -m tuna_lab ARGS`` as a process (``module`` may be ``tuna_lab.cli``); a :class:`subprocess.CompletedProcess`."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def wait_until(predicate, timeout, what, interval=0.1):
    """``predicate()``'s first true value within ``timeout`` seconds, else an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def group_alive(pgid):
    """True while a process of group ``pgid`` other than a zombie is alive."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(p.info["status"] != psutil.STATUS_ZOMBIE for p in psutil.process_iter(["status"])
               if _pgid(p.pid) == pgid)


class ProcessGroup:
    """A server process tree started in its own session (its log in ``workdir/NAME.log``), stopped as a group.

    ``{port}`` and ``{pidfile}`` in ``argv`` are this server's free port and
    pidfile path; ``cwd`` defaults to ``workdir``.
    """

    def __init__(self, argv, env, workdir, name, cwd=None):
        from tuna_lab.server.launch import free_port

        self.port = free_port()
        self.log = Path(workdir) / f"{name}.log"
        self.pidfile = Path(workdir) / f"{name}.pid"
        argv = [str(a).format(port=self.port, pidfile=self.pidfile) for a in argv]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd or workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.master = self.proc.pid

    def workers(self):
        """Live worker PIDs, oldest first (multiprocessing's resource tracker is no worker)."""
        out = []
        try:
            children = psutil.Process(self.master).children()
        except psutil.NoSuchProcess:
            return []
        for child in children:
            try:
                if child.status() == psutil.STATUS_ZOMBIE or "resource_tracker" in " ".join(child.cmdline()):
                    continue
                out.append((child.create_time(), child.pid))
            except psutil.NoSuchProcess:
                continue
        return [pid for _, pid in sorted(out)]

    def text(self):
        """The server's log so far."""
        return self.log.read_text(errors="replace")

    def stop(self):
        """SIGTERM the group, SIGKILL what is left, and wait until no process of the group is left."""
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.master, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                # The group may outlive its leader a moment (workers still exiting).
                wait_until(lambda: not group_alive(self.master), wait, "the server's processes to exit")
                break
            except (subprocess.TimeoutExpired, AssertionError):
                continue
        self.proc.wait(5)
        for path in Path(tempfile.gettempdir()).glob(f"tuna_lab-gunicorn-{os.getuid()}-{self.master}-*"):
            shutil.rmtree(path, ignore_errors=True)


def train_user_model(path):
    """Train tests/userapp's model (XGBoost on made-up data) into ``path``, in a process of its own.

    A process of its own: XGBoost's OpenMP pool then lives and dies there,
    not in the test process whose threads some tests count.
    """
    subprocess.run([sys.executable, "-c", f"import usermodel; usermodel.train({str(path)!r})"], cwd=USERAPP,
                   check=True, timeout=120)
    return Path(path)


def simulated_race(start_seconds, drain_seconds=0.0, fails=()):
    """A race target on a simulated clock: ``(evaluate, clock)`` for :func:`tuna_lab.measure.tune.race.race`.

    Each run costs ``start_seconds`` (a server start), each step its duration and ``drain_seconds``. A
    candidate serves 30 requests a second per worker (p99 10 ms below that, 0.5 s above); every step of a
    policy in ``fails`` fails.
    """
    from tuna_lab.measure.tune.race import Step

    now = [0.0]

    def evaluate(candidate, rnd, next_step):
        now[0] += start_seconds
        step = next_step(None)
        while step is not None:
            rate, duration = step
            now[0] += duration + drain_seconds
            capacity = 30.0 * candidate.workers
            n = max(int(rate * duration), 1)
            error = "HTTP 500" if candidate.policy in fails else ""
            step = next_step(Step(rate, duration, n, n if rate > capacity else 0, 0.5 if rate > capacity else 0.01,
                                  seconds=duration, error=error))

    return evaluate, lambda: now[0]
