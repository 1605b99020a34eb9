"""Fixtures of the browser tests: Debian's chromium, a Voila or JupyterLab server on loopback, a fresh page.

Every process started here is stopped again, also when a test fails: the
server and every process under it (its kernels, and the Gunicorn servers a
kernel starts, run in sessions of their own, so they are found through their
parent, not the process group), and chromium through Playwright. Artifacts
(screenshots, the server's log, the browser's console, the kernel messages the
page sent and got) go to ``test-artifacts/ui/``. ``TUNA_UI_CPU_THROTTLE=N``
runs the page's JavaScript N times slower, to reproduce a slow machine.
"""

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuna_lab.server.launch import free_port  # the launcher's own loopback port picker

try:
    from playwright.sync_api import sync_playwright
except ImportError as exc:        # a missing extra is a setup error, not a reason to skip
    raise ImportError("the browser tests need the ui extra: pip install -e '.[ui]'") from exc

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts" / "ui"
NOTEBOOKS = REPO / "notebooks"
NOTEBOOK = "notebooks/03_scatter_vs_compact.ipynb"
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "/usr/bin/chromium", "/usr/lib/chromium/chromium")
SERVER_START_TIMEOUT = 60         # s until Voila or JupyterLab accepts connections
STOP_TIMEOUT = 15                 # s for Voila or JupyterLab to shut its kernels down on SIGTERM
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--headless", "--disable-dev-shm-usage", "--no-first-run",
    "--disable-extensions", "--disable-background-networking",
    # Loopback only: anything else (the page asks for web fonts on a CDN) fails at once, without DNS waits.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    # Let fixtures see whether the test failed (to save a full-page screenshot).
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def artifacts():
    """``test-artifacts/ui/``, emptied of the last run's screenshots and logs."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in [*ARTIFACTS.glob("*.png"), *ARTIFACTS.glob("*.log")]:
        old.unlink()
    return ARTIFACTS


@pytest.fixture(scope="session")
def chromium_path():
    """Debian's chromium (``TUNA_CHROMIUM`` overrides); skip only when there is none that runs."""
    wanted = os.environ.get("TUNA_CHROMIUM")
    for candidate in ([wanted] if wanted else CHROMIUM_CANDIDATES):
        path = shutil.which(candidate)
        if path is None:
            continue
        try:
            done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and "chrom" in done.stdout.lower():
            return path
    pytest.skip(f"no runnable chromium ({wanted or ', '.join(CHROMIUM_CANDIDATES)}): "
                "install Debian's with `apt-get install -y chromium` (make test-ui does) or set TUNA_CHROMIUM")


def _start_time(pid):
    """The process's start time (clock ticks since boot), or None when it is gone: guards against pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _descendants(root):
    """``{pid: start time}`` of every process below ``root``, whatever its session or process group."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            if pid not in found and (started := _start_time(pid)) is not None:
                found[pid] = started
                todo.append(pid)
    return found


def _signal_all(procs, sig):
    for pid, started in procs.items():
        if _start_time(pid) == started:          # still the process we found, not a reused pid
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _wait_gone(procs, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_start_time(pid) != started for pid, started in procs.items()):
            return True
        time.sleep(0.2)
    return False


def command_line(pid):
    """The process's command line as one string ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def stop_tree(proc):
    """Stop ``proc`` (a Popen) and everything it started: SIGTERM, then SIGKILL for whatever stays.

    Returns the command lines of the processes that outlived the server's own
    shutdown (the server gone, they still ran): none when it stopped its kernels.
    """
    below = _descendants(proc.pid)
    if proc.poll() is None:
        proc.terminate()                         # Voila and JupyterLab shut their kernels down on SIGTERM
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    _wait_gone(below, 5)
    left = {pid: started for pid, started in below.items() if _start_time(pid) == started}
    outlived = [command_line(pid) for pid in left]
    _signal_all(left, signal.SIGTERM)
    if not _wait_gone(left, 5):
        _signal_all(left, signal.SIGKILL)
        _wait_gone(left, 5)
    return outlived


def _quiet_env(tmp_path):
    """The server's environment: its own Jupyter dirs under ``tmp_path``, modest CPU use."""
    return dict(os.environ, JUPYTER_PLATFORM_DIRS="1", JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
                PYDEVD_DISABLE_FILE_VALIDATION="1",
                # modest CPU use on a shared machine: no thread pools in the kernel
                OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


@contextlib.contextmanager
def serving(cmd, port, log_path, env, cwd=REPO):
    """Run the server ``cmd`` until it listens on 127.0.0.1:``port``; yield its Popen; stop its whole tree."""
    name = Path(cmd[2] if cmd[1] == "-m" else cmd[0]).name
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with status {proc.returncode} before serving; see {log_path}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} did not listen on 127.0.0.1:{port} within {SERVER_START_TIMEOUT}s; "
                                f"see {log_path}")
                time.sleep(0.25)
        yield proc
    finally:
        stop_tree(proc)


@pytest.fixture
def voila_url(artifacts, tmp_path):
    """Voila serving notebook 03 on 127.0.0.1 (a free port); its log in the artifacts."""
    port = free_port()
    cmd = [sys.executable, "-m", "voila", NOTEBOOK, "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
           "--VoilaConfiguration.show_tracebacks=True"]
    with serving(cmd, port, artifacts / "voila.log", _quiet_env(tmp_path)):
        yield f"http://127.0.0.1:{port}/"


class Lab:
    """A running JupyterLab: its ``url`` (no token), ``token``, notebook folder ``root`` and Popen ``proc``."""

    def __init__(self, proc, url, token, root):
        self.proc, self.url, self.token, self.root = proc, url, token, root

    def open_url(self, path):
        """The URL that opens ``path`` (relative to ``root``) in JupyterLab, logged in with the token."""
        return f"{self.url}lab/tree/{path}?token={self.token}"

    def processes(self):
        """``{pid: command line}`` of every process below the server (kernels, what they started)."""
        return {pid: command_line(pid) for pid in _descendants(self.proc.pid)}

    def stop(self):
        """Stop the server and everything under it; the command lines of what outlived its shutdown."""
        return stop_tree(self.proc)


@pytest.fixture
def lab(request, artifacts, tmp_path):
    """JupyterLab on 127.0.0.1 (a free port) with a random token, on copies of the notebooks.

    Copies, so that running cells (and Lab's autosave) never touch the notebooks in the
    repository, whose stored outputs are what nbval compares; its log in the artifacts.
    """
    root = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "_build.py"))
    config = tmp_path / "jupyter-config"
    config.mkdir()
    # No announcements or update checks (no network here, and no pop-ups over the notebook).
    (config / "jupyter_server_config.json").write_text(json.dumps(
        {"LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"}}))
    settings = tmp_path / "lab-settings"
    # ... and no "Would you like to get notified about official Jupyter news?" over the notebook.
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    # ... and every cell in the page: with windowing, cells scrolled out of view are not rendered, so a
    # long notebook's first prompts would read as never run.
    (settings / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"}))
    env = dict(_quiet_env(tmp_path), JUPYTER_CONFIG_DIR=str(config), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "lab-workspaces"))
    port, token = free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:            # Jupyter refuses to run as root unless told (containers, CI)
        cmd.append("--allow-root")
    with serving(cmd, port, artifacts / f"jupyterlab-{request.node.name}.log", env) as proc:
        yield Lab(proc, f"http://127.0.0.1:{port}/", token, root)


def _kernel_message(payload):
    """One line about a Jupyter message on the kernel WebSocket (binary v1 protocol or JSON)."""
    try:
        if isinstance(payload, str):
            msg = json.loads(payload)
            channel, header, content = msg.get("channel"), msg["header"], msg["content"]
        else:
            n = int.from_bytes(payload[:8], "little")
            offsets = [int.from_bytes(payload[8 + 8 * i:16 + 8 * i], "little") for i in range(n)]
            parts = [payload[a:b] for a, b in zip(offsets, offsets[1:])]
            channel, header, content = parts[0].decode(), json.loads(parts[1]), json.loads(parts[4])
    except (ValueError, KeyError, IndexError, UnicodeDecodeError):
        return f"({len(payload)} bytes, not a kernel message)"
    data = content.get("data") or {}
    line = f"{channel} {header.get('msg_type')}"
    if "comm_id" in content:
        line += f" comm={content['comm_id'][:8]} {data.get('method', '')} {sorted(data.get('state') or {})}"
    elif "execution_state" in content:
        line += f" {content['execution_state']}"
    return line


@pytest.fixture
def console():
    """The page's console messages and uncaught errors, as ``"seconds type: text"`` lines."""
    return []


@pytest.fixture
def page(request, chromium_path, artifacts, tmp_path, console):
    """A page of headless chromium with a fresh profile; its console kept, a screenshot on failure."""
    kernel_log, start = [], time.monotonic()
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=chromium_path, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000}, timeout=60_000)
        try:
            context.set_default_timeout(30_000)
            page = context.pages[0] if context.pages else context.new_page()
            page.on("console", lambda m: console.append(f"{time.monotonic() - start:7.2f} {m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"{time.monotonic() - start:7.2f} pageerror: {e}"))

            # The kernel's messages both ways (what reached the page after a click, when a redraw is missing).
            def watch(ws):
                for event, way in (("framereceived", "<-"), ("framesent", "->")):
                    ws.on(event, lambda payload, way=way: kernel_log.append(
                        f"{time.monotonic() - start:7.2f} {way} {_kernel_message(payload)}"))
            page.on("websocket", watch)
            # TUNA_UI_CPU_THROTTLE=N: run the page's JavaScript N times slower (a slow machine, reproducibly).
            if float(os.environ.get("TUNA_UI_CPU_THROTTLE", "1")) > 1:
                context.new_cdp_session(page).send(
                    "Emulation.setCPUThrottlingRate", {"rate": float(os.environ["TUNA_UI_CPU_THROTTLE"])})
            yield page
            failed = getattr(request.node, "report_call", None)
            if failed is not None and failed.failed:
                page.screenshot(path=artifacts / "failure-page.png", full_page=True, timeout=20_000)
        finally:
            (artifacts / "console.log").write_text("\n".join(console) + "\n")
            (artifacts / "websocket.log").write_text("\n".join(kernel_log) + "\n")
            context.close()
