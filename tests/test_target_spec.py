"""The CLI parses, measure builds: the target spec, its one builder, and the one sender of ``pin``'s requests.

No server is started: the options are read in this process (``tuna-lab run`` refused before anything
runs), and the sender talks to a small HTTP server on a thread of this process.
"""

import http.server
import re
import socket
import threading
from argparse import Namespace

import pytest

from helpers import main
from tuna_lab.cli.options import target_spec_of
from tuna_lab.errors import ExperimentError, LoadError, PinError, TargetError
from tuna_lab.measure.loadgen.requests import Requests
from tuna_lab.measure.loadgen.rounds import round_sender
from tuna_lab.measure.target_spec import TargetSpec, build_target


def options(**given):
    """The "your own server" options of ``run`` as argparse leaves them, with ``given`` set."""
    base = dict(app=None, pid=None, url=None, path="/", method=None, header=[], body=None, bodies=None,
                server_timing=None, label=None, app_dir=None, server_conf=None, python=None, front_cpus=None,
                server="gunicorn", force=False, workers=None, threads=None)
    return Namespace(**{**base, **given})


# -- options -> spec (parsing only), spec -> target (measure) -----------------------------------------

def test_the_options_become_a_spec_and_nothing_is_read():
    # A PID that is no process and a body file that does not exist: the spec is data, read by build_target.
    spec = target_spec_of(options(pid=2 ** 22 + 1, url="http://127.0.0.1:9/", threads=2, body="/nonexistent.json",
                                  header=["X-Key: 1"], front_cpus="1,0"), ExperimentError)
    assert spec == TargetSpec(pid=2 ** 22 + 1, url="http://127.0.0.1:9/", threads=2, body="/nonexistent.json",
                              headers=("X-Key: 1",), front_cpus=(0, 1))
    assert spec.kind == "attached"
    with pytest.raises(TargetError, match="--body /nonexistent.json"):
        build_target(spec)
    app = target_spec_of(options(app="myapp:app", path="/score", app_dir="/srv"), ExperimentError)
    assert (app.kind, app.app, app.path, app.app_dir) == ("app", "myapp:app", "/score", "/srv")
    assert target_spec_of(options(), ExperimentError) == TargetSpec() and build_target(TargetSpec()) is None


@pytest.mark.parametrize("given, says", [
    (dict(app="a:b", pid=1), "give --app (a server tuna_lab starts) or --pid"),
    (dict(pid=1, threads=1), "--pid needs --url"),
    (dict(pid=1, url="http://127.0.0.1:9/", threads=1, workers=2), "leave out -w"),
    (dict(pid=1, url="http://127.0.0.1:9/", threads=1, front_cpus=","), "--front-cpus names no CPU"),
    (dict(pid=1, url="http://127.0.0.1:9/", threads=1, front_cpus="x"), "--front-cpus: bad cpulist"),
    (dict(app="a:b", url="http://127.0.0.1:9/"), "--url is for a running server"),
    (dict(app="a:b", front_cpus="0"), "--front-cpus is for a running server"),
    (dict(body="x.json"), "--body is for your own server"),
])
def test_options_that_do_not_go_together_are_the_commands_error(given, says):
    with pytest.raises(ExperimentError, match=re.escape(says)):
        target_spec_of(options(**given), ExperimentError)


def test_a_spec_of_both_an_app_and_a_pid_is_refused():
    with pytest.raises(TargetError, match="not both"):
        TargetSpec(app="myapp:app", pid=1)


def test_run_refuses_a_target_it_cannot_build_in_one_line(tmp_path):
    # build_target reads the PID (no such process) in measure: still one line and exit 2, nothing written.
    r = main("run", "--pid", 2 ** 22 + 1, "--url", "http://127.0.0.1:9/", "-t", 1, "--policies", "cfs",
             "--out", tmp_path / "out")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(2 ** 22 + 1) in r.stderr and not (tmp_path / "out").exists()


# -- the one sender: pin's and status's rounds go through the load generator ---------------------------

class _Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append((self.client_address, self.headers.get("Content-Type")))
        ok = self.headers.get("Content-Type") == "application/json"
        self.send_response(200 if ok else 415)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def answering():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/predict"
    server.shutdown()
    server.server_close()


def test_a_round_sends_each_request_on_a_connection_of_its_own(answering):
    # One connection per request: the kernel hands each to whichever worker accepts it, so all get some.
    _Answer.seen.clear()
    round_sender(Requests(path=answering, bodies=(b"{}",)), error=PinError)(4)
    assert len(_Answer.seen) == 4 and len({address for address, _ in _Answer.seen}) == 4
    assert {ctype for _, ctype in _Answer.seen} == {"application/json"}


def test_a_refused_round_says_what_it_sent_in_one_line(answering):
    send = round_sender(Requests(path=answering, bodies=(b"{}",), headers=(("Content-Type", "text/csv"),)),
                        error=PinError)
    with pytest.raises(PinError) as caught:
        send(2)
    said = str(caught.value)
    assert "answered 415 Unsupported Media Type to POST, Content-Type text/csv, a 2-byte body" in said
    assert "\n" not in said


@pytest.mark.parametrize("url", ["http://example.com/", "ftp://127.0.0.1/", "127.0.0.1:80"])
def test_a_url_off_this_machine_is_refused_before_any_socket(url):
    with pytest.raises(LoadError, match="loopback"):
        round_sender(Requests(path=url, method="GET"))


def test_a_round_to_a_port_nothing_listens_on_says_refused():
    # The wire sends before it knows the connection failed (a "Broken pipe"): the user is told why it did.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(PinError, match="cannot send GET .*: Connection refused"):
        round_sender(Requests(path=f"http://127.0.0.1:{port}/", method="GET"), error=PinError)(1)
