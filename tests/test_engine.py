"""The load generator's C loop (issue 50) against its Python loop: the same rows, whichever runs.

A scripted HTTP/1.1 server in a thread of this process (no server process: the fast lane's rule)
answers each request as its path says - headers and body in one write or several, chunked, to the
connection's close, an interim 100 first, one or two Server-Timing headers, a malformed status line,
a close mid-body, a 3 MB body, an answer that never comes - and both loops are held to the same
statuses, errors, bodies and Server-Timing values. The C loop's framing is held to the Python
parser's at every cut of every response (``_engine.frame``).
"""

import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tuna_lab.errors import LoadError
from tuna_lab.measure.loadgen import native, wire
from tuna_lab.measure.loadgen.response import parse_buffer
from tuna_lab.measure.records import Records

BIG = b"x" * (3 << 20)   # past the C loop's first buffer (16 kB) and the Python loop's recv (256 kB)


def _head(status="200 OK", *lines):
    return ("\r\n".join((f"HTTP/1.1 {status}",) + lines) + "\r\n\r\n").encode()


# path -> (the chunks written, a pause between them, whether the server then closes)
SCRIPTS = {
    "one": ([_head("200 OK", "Content-Length: 2") + b"ok"], False),
    "two": ([_head("200 OK", "Connection: close", "Content-Length: 5"), b"hello"], True),
    "chunked": ([_head("200 OK", "Transfer-Encoding: chunked"), b"3\r\nabc\r\n", b"2\r\nde\r\n0\r\n\r\n"], False),
    "to-close": ([_head("200 OK"), b"to the ", b"end"], True),
    "interim": ([_head("100 Continue"), _head("200 OK", "Content-Length: 1") + b"y"], False),
    "timing": ([_head("200 OK", "Server-Timing: app;dur=2.5", "Content-Length: 0")], False),
    "timings": ([_head("200 OK", "Server-Timing: a;dur=1", "Content-Length: 0", "server-timing: b;dur=2")], False),
    "no-content": ([_head("204 No Content")], False),
    "status": ([_head("404 Not Found", "Content-Length: 7") + b"missing"], False),
    "malformed": ([b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n"], True),
    "cut": ([_head("200 OK", "Content-Length: 100") + b"only ten b"], True),
    "silent": ([], True),
    "big": ([_head("200 OK", "Content-Length: %d" % len(BIG)), BIG], False),
    # Kept alive by the header, closed by the server once answered: a reused connection is found dead.
    "liar": ([_head("200 OK", "Content-Length: 2") + b"ok"], True),
}


class ScriptedServer:
    """Answers each request by its path's script (:data:`SCRIPTS`); ``/hang`` never answers."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    try:
                        got = conn.recv(65536)
                    except OSError:
                        return
                    if not got:
                        return
                    buf += got
                head, buf = buf.split(b"\r\n\r\n", 1)
                fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
                need = int(fields.get(b"Content-Length", b"0"))
                while len(buf) < need:
                    buf += conn.recv(65536)
                buf = buf[need:]
                path = head.split(b" ")[1].decode().strip("/")
                if path == "hang":
                    self.stop.wait(10)
                    return
                chunks, close = SCRIPTS[path]
                try:
                    for k, chunk in enumerate(chunks):
                        if k:
                            time.sleep(0.005)   # a read of its own for each chunk
                        conn.sendall(chunk)
                except OSError:
                    return
                if close:
                    return

    def close(self):
        self.stop.set()
        self.sock.close()


@pytest.fixture(scope="module")
def scripted():
    srv = ScriptedServer()
    yield srv
    srv.close()


def _trial(url, engine, n=6, concurrency=2, timeout=5.0, deadline=10.0, schedule=None, method="GET"):
    rec = Records(n, scheduled=schedule, response="any")
    request = wire.request_bytes(url, b"", method=method)
    end = wire.drive(rec, wire.resolve(url), request, concurrency, timeout, deadline, schedule=schedule,
                     engine=engine)
    rec.cut(end)
    return rec


def _rows(rec):
    return (rec.status.tolist(), rec.error.tolist(), rec.raw.tolist(), rec.timing.tolist())


def test_the_c_loop_runs_a_plain_closed_loop_in_this_venv(scripted):
    # `pip install -e .` (make setup) builds the extension: where it did not, this fails and says why.
    assert native.choose() == ("c", ""), native.choose()
    rec = _trial(scripted.url + "/one", None)
    assert rec.engine == {"engine": "c", "engine_why": ""}
    assert rec.status.tolist() == [200] * 6 and rec.raw.tolist() == [b"ok"] * 6
    assert np.isfinite(rec.origin) and (rec.done >= rec.sent).all() and (rec.sent == rec.scheduled).all()


def test_the_python_loop_runs_when_asked_and_says_so(scripted):
    rec = _trial(scripted.url + "/one", "python")
    assert rec.engine == {"engine": "python", "engine_why": "asked for"}
    assert rec.status.tolist() == [200] * 6


@pytest.mark.parametrize("path, status, raw, timing", [
    ("one", 200, b"ok", None),
    ("two", 200, b"hello", None),
    ("chunked", 200, b"abcde", None),
    ("to-close", 200, b"to the end", None),
    ("interim", 200, b"y", None),
    ("timing", 200, b"", b"app;dur=2.5"),
    ("timings", 200, b"", b"a;dur=1, b;dur=2"),
    ("no-content", 204, b"", None),
    ("status", 404, b"missing", None),
    ("liar", 200, b"ok", None),
])
def test_both_loops_read_every_framing_alike(scripted, path, status, raw, timing):
    rows = {}
    for engine in native.ENGINES:
        rec = _trial(scripted.url + "/" + path, engine)
        assert rec.status.tolist() == [status] * 6, (engine, rec.error.tolist())
        assert rec.raw.tolist() == [raw] * 6 and rec.timing.tolist() == [timing] * 6, engine
        assert (rec.error == "").all() and (rec.done >= rec.sent).all(), engine
        rows[engine] = _rows(rec)
    assert rows["c"] == rows["python"]


@pytest.mark.parametrize("path, error", [
    ("malformed", "bad response: not an HTTP/1.x status line: 'HTTP/2 200 OK'"),
    ("cut", "bad response: connection closed in the middle of the response"),
    ("silent", "server closed the connection without a response"),
])
def test_both_loops_fail_a_broken_answer_with_the_same_words(scripted, path, error):
    for engine in native.ENGINES:
        rec = _trial(scripted.url + "/" + path, engine, n=3)
        assert rec.status.tolist() == [-1] * 3 and rec.error.tolist() == [error] * 3, engine


def test_a_body_larger_than_every_buffer_arrives_whole(scripted):
    rec = _trial(scripted.url + "/big", "c", n=2, concurrency=1)
    assert rec.status.tolist() == [200, 200] and [len(b) for b in rec.raw] == [len(BIG)] * 2
    assert rec.raw[0] == BIG


def test_a_head_request_reads_no_body(scripted):
    # The server sends no body to a HEAD, whatever its Content-Length says: the loop must not wait for one.
    rec = _trial(scripted.url + "/one", "c", n=3, timeout=2.0, method="HEAD")
    assert rec.status.tolist() == [200] * 3 and rec.raw.tolist() == [b""] * 3


def test_timeouts_and_refused_connections_are_rows(scripted):
    for engine in native.ENGINES:
        rec = _trial(scripted.url + "/hang", engine, n=2, timeout=0.2, deadline=3.0)
        assert rec.error.tolist() == ["timeout"] * 2 and rec.status.tolist() == [-1] * 2, engine
        assert ((rec.done - rec.sent) >= 0.2).all()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The C loop sends once and reads the refusal; the Python loop sends a second time and reads the
    # broken pipe the first left (rounds.py says the same of it): both are connect failures.
    rec = _trial(f"http://127.0.0.1:{port}/one", "c", n=2)
    assert rec.error.tolist() == ["connect: Connection refused"] * 2
    rec = _trial(f"http://127.0.0.1:{port}/one", "python", n=2)
    assert all(e.startswith("connect: ") for e in rec.error) and (rec.status == -1).all()


@pytest.mark.alone   # it bounds the send lag (conftest.py)
def test_the_open_loop_sends_on_its_schedule(scripted):
    at = np.arange(8) * 0.01
    rec = _trial(scripted.url + "/one", "c", n=8, concurrency=8, schedule=at)
    assert rec.status.tolist() == [200] * 8 and (rec.scheduled == at).all()
    # Never early; late only by the machine's wake-up lag (generous: 2 shared CPUs).
    assert (rec.sent >= at - 1e-6).all() and (rec.sent - at < 0.5).all()


def test_an_unknown_engine_is_refused_in_one_line(scripted):
    with pytest.raises(LoadError, match="engine must be one of c, python or None"):
        _trial(scripted.url + "/one", "rust")


def test_without_the_extension_the_python_loop_runs_and_says_why():
    # As a venv whose install could not compile it: the import fails, the Python loop is chosen, with the reason.
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.endswith('loadgen._engine'):\n"
            "            raise ImportError('no C compiler at install time')\n"
            "sys.meta_path.insert(0, Block())\n"
            "from tuna_lab.measure.loadgen import native\n"
            "print(native.choose())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("('python', 'the C engine is not built (no C compiler at install time)"), out.stdout


# -- the framing, at every cut -----------------------------------------------------------

RESPONSES = [
    b"HTTP/1.1 200 OK\r\nServer: gunicorn\r\nConnection: close\r\nContent-Length: 12\r\n\r\n{\"count\": 1}",
    b"HTTP/1.1 200 OK\r\nCONTENT-LENGTH:  2 \r\nServer-Timing:  app;dur=1 \r\n\r\nok",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.0 200 OK\r\n\r\nto the end",
    b"HTTP/1.1 201\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
    b"HTTP/1.1 2000\r\n\r\n", b"HTTP/1.1 2\r\n\r\n", b"HTTP/1.1 200\nX: y\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nServer-Timing: a\r\nServer-Timing: b\r\nContent-Length: 0\r\n\r\n",
]


def _python(buf, eof, no_body, timing):
    try:
        return parse_buffer(buf, eof, no_body, timing)
    except ValueError as exc:
        return f"ValueError: {exc}"


def _c(buf, eof, no_body, timing):
    try:
        return native._engine.frame(buf, eof, no_body, timing, parse_buffer)[0]
    except ValueError as exc:
        return f"ValueError: {exc}"


@pytest.mark.parametrize("raw", RESPONSES)
def test_the_c_framing_is_the_python_parsers_at_every_cut(raw):
    for cut in range(len(raw) + 1):
        for eof in (False, True):
            for no_body in (False, True):
                buf = raw[:cut] + (b"HTTP/1.1 500 X\r\n" if cut == len(raw) and not eof else b"")
                assert _c(buf, eof, no_body, True) == _python(buf, eof, no_body, True), (buf, eof, no_body)
    # The usual response is read without the Python parser (else the C loop saves nothing).
    assert native._engine.frame(RESPONSES[0], False, False, True, parse_buffer)[1] is False


def test_the_c_framing_survives_garbage():
    # Random bytes, and random bytes after a valid head: the same answer as the parser, no crash.
    rng = np.random.default_rng(50)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n"
    for k in range(400):
        tail = rng.integers(0, 256, rng.integers(0, 80)).astype(np.uint8).tobytes()
        tail = tail.replace(b"\x01", b"\r\n")
        for buf in (tail, head + tail, b"HTTP/1.1 " + tail + b"\r\n\r\n"):
            assert _c(buf, bool(k % 2), False, True) == _python(buf, bool(k % 2), False, True), buf


def test_a_trials_load_and_its_row_name_the_loop_that_sent_it(scripted):
    from tuna_lab.measure.loadgen.load import closed_loop
    from tuna_lab.measure.loadgen.requests import Send
    from tuna_lab.measure.trials import _generator_columns

    frame = closed_loop(scripted.url + "/one", b"", requests=4, concurrency=2, send=Send(method="GET", response="any"),
                        timeout=5)
    generator = frame.attrs["generator"]
    assert (generator["engine"], generator["engine_why"]) == ("c", "")
    assert _generator_columns(generator)["generator_engine"] == "c"
    assert _generator_columns({**generator, "engine": "python", "engine_why": "asked for"})["generator_engine"] == \
        "python: asked for"
