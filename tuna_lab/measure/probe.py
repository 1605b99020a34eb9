"""The user's interpreter, tried before a trial: :func:`check_python`, :func:`check_imports`.

``run --app`` and ``tune --app`` start the user's app under the user's own
Python (``--python``). Before any server starts, that interpreter imports the
server, tuna_lab's Gunicorn hooks and the app as the server will
(:func:`check_imports`), in a private state folder of the run
(:func:`state_folder`) that makes this tuna_lab importable there
(:func:`tuna_lab_path`).
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile

from ..errors import TargetError

__all__ = ["check_python", "state_folder", "tuna_lab_path", "check_imports"]

# Seconds the user's interpreter may take to import the app (it may load a model).
_IMPORT_TIMEOUT = 180.0
# The oldest Python tuna_lab's own code (the Gunicorn hooks) runs on (pyproject's requires-python).
_OLDEST_PYTHON = (3, 11)
# Run by the user's interpreter, of any Python 3 version: the server, tuna_lab's hooks, then the app, imported
# as the server will; the last line says how far it got (the app may print to stdout as it imports).
_IMPORT_CHECK = r"""
import importlib, json, os, sys, traceback
module, attr, server, hooks, oldest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]
out = {"version": ".".join(map(str, sys.version_info[:3]))}
def done(stage=None):
    if stage:
        lines = traceback.format_exc().strip().splitlines()
        out.update(failed=stage, error=lines[-1] if lines else "")
    sys.stdout.write("\ntuna-lab-check " + json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)                     # not waiting for threads the app started
try:
    importlib.import_module(server)
    if server == "gunicorn":
        import gunicorn.config
        out["control_socket"] = hasattr(gunicorn.config, "ControlSocketDisable")
except BaseException:
    done("server")
if hooks:
    if sys.version_info[:2] < tuple(map(int, oldest.split("."))):
        out["failed"] = "version"
        done()
    try:
        for name in ("tuna_lab.integrations.gunicorn", "tuna_lab.live.pin", "tuna_lab.live.binding",
                     "tuna_lab.placement.plan", "tuna_lab.machine.topology"):
            importlib.import_module(name)
    except BaseException:
        done("hooks")
try:
    getattr(importlib.import_module(module), attr)
except BaseException:
    done("app")
done()
"""


def check_python(python):
    """The interpreter's path, as given (a venv's ``python`` is a link: never resolved); TargetError if none."""
    if python is None:
        return sys.executable
    path = os.path.abspath(os.path.expanduser(str(python)))
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise TargetError(f"--python {python}: no executable file there")
    return path


def state_folder():
    """A private folder for one AppTarget, named after this process (PID and start time).

    A folder a SIGKILLed run left is removed by the next run's.
    """
    from ..machine.procfs import remove_dead_folders, start_ticks

    prefix = f"tuna-lab-app-{os.geteuid()}-"
    remove_dead_folders(tempfile.gettempdir(), rf"{prefix}(\d+)-(\d+)\..*",
                        lambda path, match: [(int(match[1]), int(match[2]))])
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{start_ticks(os.getpid())}.")


def tuna_lab_path(state):
    """A folder in ``state`` holding only a link to this tuna_lab package: put on another interpreter's path.

    Only tuna_lab, never the folder it is installed in: that may be this
    environment's ``site-packages``, whose packages would shadow the user's.
    """
    import tuna_lab

    folder = os.path.join(state, "python")
    if not os.path.isdir(folder):
        os.mkdir(folder, 0o700)
        os.symlink(os.path.dirname(os.path.abspath(tuna_lab.__file__)), os.path.join(folder, "tuna_lab"))
    return folder


def _run_probe(argv, env, cwd, keep=1 << 16):
    """Run the import probe ``argv`` until it exits: a CompletedProcess with the last ``keep`` bytes it wrote.

    Its output goes to files, not pipes, and the wait is for the probe
    itself: a process the app starts as it is imported (a helper, a
    background server) inherits the probe's output, and a pipe would reach
    its end only when that process ended too. The probe runs in a session
    of its own, and whatever it leaves running is stopped with it.
    """
    import signal

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=_IMPORT_TIMEOUT)
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

        def tail(fh):
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - keep))
            return fh.read().decode(errors="replace")

        return subprocess.CompletedProcess(argv, code, tail(out), tail(err))


def check_imports(target, env):
    """Import ``target``'s app in its interpreter (see :meth:`AppTarget.check`); Gunicorn's control socket flag."""
    module, _, attr = target.app.partition(":")
    oldest = ".".join(map(str, _OLDEST_PYTHON))
    argv = [target.python, "-c", _IMPORT_CHECK, module, attr, target.server,
            "1" if target.server == "gunicorn" else "0", oldest]
    try:
        done = _run_probe(argv, env, target.app_dir)
    except subprocess.TimeoutExpired:
        raise TargetError(f"--app {target.app} did not import in {target.python} within "
                          f"{_IMPORT_TIMEOUT:g} s") from None
    except OSError as exc:
        raise TargetError(f"--python {target.python}: cannot run it ({exc.strerror or exc})") from None
    last = done.stdout.rstrip().rpartition("\n")[2]
    if not last.startswith("tuna-lab-check "):
        said = done.stderr.strip().splitlines()
        raise TargetError(f"--python {target.python} is no Python interpreter tuna_lab can use "
                          f"(exit status {done.returncode}{': ' + said[-1] if said else ''})")
    out = json.loads(last.partition(" ")[2])
    failed, error = out.get("failed"), out.get("error", "")
    if failed == "server":
        raise TargetError(f"{target.python} cannot import {target.server} ({error}): install it in that "
                          f"environment")
    if failed == "version":
        raise TargetError(f"{target.python} is Python {out['version']}: tuna_lab's Gunicorn hooks run in the app's "
                          f"workers and need Python {oldest} or newer")
    if failed == "hooks":
        raise TargetError(f"{target.python} cannot run tuna_lab's Gunicorn hooks ({error}): install what they "
                          "need (psutil, lazy_loader, numpy) in that environment")
    if failed == "app":
        raise TargetError(f"--app {target.app} does not import in {target.python}: {error}")
    return bool(out.get("control_socket"))
