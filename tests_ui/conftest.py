"""Fixtures of the browser tests: Debian's chromium, a Voila server on loopback, a fresh page.

Every process started here is stopped again, also when a test fails: the
Voila server and every process under it (its kernels run in sessions of their
own, so they are found through their parent, not the process group), and
chromium through Playwright. Artifacts (screenshots, the server's log, the
browser's console, the kernel messages the page sent and got) go to
``test-artifacts/ui/``. ``TUNA_UI_CPU_THROTTLE=N`` runs the page's JavaScript
N times slower, to reproduce a slow machine.
"""

import json
import os
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
NOTEBOOK = "notebooks/03_scatter_vs_compact.ipynb"
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "/usr/bin/chromium", "/usr/lib/chromium/chromium")
SERVER_START_TIMEOUT = 60         # s until Voila accepts connections
STOP_TIMEOUT = 15                 # s for Voila to shut its kernels down on SIGTERM
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


def stop_tree(proc):
    """Stop ``proc`` (a Popen) and everything it started: SIGTERM, then SIGKILL for whatever stays."""
    below = _descendants(proc.pid)
    if proc.poll() is None:
        proc.terminate()                         # Voila shuts its kernels down on SIGTERM
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    _signal_all(below, signal.SIGTERM)
    if not _wait_gone(below, 5):
        _signal_all(below, signal.SIGKILL)
        _wait_gone(below, 5)


@pytest.fixture
def voila_url(artifacts, tmp_path):
    """Voila serving notebook 03 on 127.0.0.1 (a free port); its log in the artifacts."""
    port = free_port()
    env = dict(os.environ, JUPYTER_PLATFORM_DIRS="1", JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               PYDEVD_DISABLE_FILE_VALIDATION="1",
               # modest CPU use on a shared machine: no thread pools in the kernel
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "voila", NOTEBOOK, "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
           "--VoilaConfiguration.show_tracebacks=True"]
    log_path = artifacts / "voila.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"voila exited with status {proc.returncode} before serving; see {log_path}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"voila did not listen on 127.0.0.1:{port} within {SERVER_START_TIMEOUT}s; "
                                f"see {log_path}")
                time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop_tree(proc)


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
