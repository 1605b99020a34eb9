"""A user's own requests and W3C Server-Timing, against a raw HTTP/1.1 server on 127.0.0.1.

The server (asyncio streams, in a thread of its own) records every request
exactly as it arrived - method, target, header lines in order, body - and
answers as the request tells it to: a JSON object body (or else the JSON of
an ``X-Reply`` header) may give ``status``, ``timing`` (the values of as many
``Server-Timing`` headers) and ``reply`` (the JSON body to answer with).
Every trial here is a few dozen requests with short timeouts and deadlines.
"""

import asyncio
import json
import math
import socket
import threading

import numpy as np
import pytest

from tuna_lab.errors import LoadError, TunaError
from tuna_lab.measure.loadgen import wire
from tuna_lab.measure.loadgen.load import (Send, aclosed_loop, aopen_loop, closed_loop, open_loop,
                                   parse_server_timing, summary)

BOUNDS = {"timeout": 5.0, "deadline": 10.0}


class RawServer:
    """An HTTP/1.1 keep-alive server that records requests and answers as each one asks."""

    def __init__(self):
        self.seen = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader, writer):
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head[:-4].decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ")
                headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:]]
                fields = {name.lower(): value for name, value in headers}
                body = await reader.readexactly(int(fields.get("content-length", "0")))
                self.seen.append({"method": method, "target": target, "headers": headers, "body": body})
                spec = _json_object(body) or _json_object(fields.get("x-reply", "").encode()) or {}
                status = spec.get("status", 200)
                reply = b"" if status == 204 else json.dumps(spec.get("reply", {"ok": True})).encode()
                out = [f"HTTP/1.1 {status} Whatever"]
                out += [f"Server-Timing: {value}" for value in spec.get("timing", [])]
                if status != 204:
                    out.append(f"Content-Length: {len(reply)}")
                writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + (b"" if method == "HEAD" else reply))
                await writer.drain()
        finally:
            writer.close()

    def close(self):
        async def stop():
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _json_object(raw):
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _spec(**spec):
    """A request body that tells the server how to answer."""
    return json.dumps(spec).encode()


@pytest.fixture(scope="module")
def raw_server():
    srv = RawServer()
    yield srv
    srv.close()


@pytest.fixture
def server(raw_server):
    raw_server.seen.clear()
    return raw_server


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- what is sent ------------------------------------------------------------------------

def test_method_and_headers_reach_the_server_as_sent(server):
    frame = closed_loop(server.url + "/v1/score?x=1", b'{"a": 1}', requests=3, concurrency=1,
                        send=Send(method="PUT", headers=[("X-Tenant", "blue team"),
                                                         ("Authorization", "Bearer t0k3n")]), **BOUNDS)
    assert (frame["status"] == 200).all() and summary(frame)["failed"] == 0
    assert len(server.seen) == 3
    for req in server.seen:
        assert (req["method"], req["target"], req["body"]) == ("PUT", "/v1/score?x=1", b'{"a": 1}')
        assert [name for name, _ in req["headers"]] == ["Host", "User-Agent", "X-Tenant", "Authorization",
                                                         "Content-Type", "Content-Length"]
        assert dict(req["headers"]) == {"Host": server.url[len("http://"):], "User-Agent": "tuna-lab",
                                        "X-Tenant": "blue team", "Authorization": "Bearer t0k3n",
                                        "Content-Type": "application/json", "Content-Length": "8"}
    assert frame.attrs["method"] == "PUT" and frame.attrs["bodies"] == 1 and frame.attrs["mode"] == "closed"


def test_a_user_content_type_and_user_agent_replace_the_defaults(server):
    closed_loop(server.url + "/p", b"a=1", requests=1,
                send=Send(headers={"content-type": "text/plain", "User-Agent": "me"},
                          content_type="application/x-ignored", response="any"), **BOUNDS)
    headers = server.seen[0]["headers"]
    assert [v for k, v in headers if k.lower() == "content-type"] == ["text/plain"]
    assert [v for k, v in headers if k.lower() == "user-agent"] == ["me"]


def test_get_and_head_without_a_body_send_no_content_headers(server):
    reply = json.dumps({"timing": ["app;dur=4"]})
    get = closed_loop(server.url + "/health", b"", requests=2, concurrency=1,
                      send=Send(method="GET", headers={"X-Reply": reply}, response="any"), **BOUNDS)
    head = open_loop(server.url + "/health", b"", rate=200.0, requests=2,
                     send=Send(method="HEAD", response="any", headers={"X-Reply": reply}), **BOUNDS)
    for frame in (get, head):
        assert (frame["status"] == 200).all() and (frame["error"] == "").all()
        assert frame["server_seconds"].tolist() == [0.004, 0.004]
    assert [r["method"] for r in server.seen] == ["GET", "GET", "HEAD", "HEAD"]
    for req in server.seen:
        names = [k.lower() for k, _ in req["headers"]]
        assert "content-type" not in names and "content-length" not in names
    assert head.attrs["method"] == "HEAD" and head.attrs["mode"] == "open"
    # The answer to a HEAD has no body: "lab" does not ask it for the lab server's JSON.
    lab_head = closed_loop(server.url + "/health", b"", requests=2,
                           send=Send(method="HEAD", headers={"X-Reply": reply}), **BOUNDS)
    assert summary(lab_head)["ok"] == 2 and lab_head.attrs["response"] == "lab"


def test_bodies_are_cycled_in_order(server):
    bodies = [b"first", b"second", b"third"]
    frame = closed_loop(server.url + "/p", bodies, requests=7, concurrency=1, send=Send(response="any"), **BOUNDS)
    assert [r["body"] for r in server.seen] == bodies * 2 + bodies[:1]
    assert frame.attrs["bodies"] == 3 and summary(frame)["ok"] == 7
    server.seen.clear()
    # A repeated body is sent where it stands in the cycle but counted once; an open loop cycles by schedule.
    frame = open_loop(server.url + "/p", (b"a", b"a", b"b"), rate=500.0, requests=6, max_in_flight=1,
                      send=Send(response="any"), **BOUNDS)
    assert [r["body"] for r in server.seen] == [b"a", b"a", b"b"] * 2
    assert frame.attrs["bodies"] == 2 and summary(frame)["ok"] == 6


def test_drive_cycles_requests_and_keeps_raw_server_timing_only_when_asked(server):
    url = server.url + "/p"
    requests = [wire.request_bytes(url, _spec(timing=["a;dur=1", "b;dur=2"])),
                wire.request_bytes(url, _spec(timing=[])),
                wire.request_bytes(url, _spec(status=201, timing=['x;desc="1, 2"']))]

    class Rec:
        def __init__(self, n, timing):
            self.status = np.full(n, -2)
            self.error = np.full(n, "", dtype=object)
            self.sent, self.done, self.scheduled = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
            self.raw = np.full(n, b"", dtype=object)
            if timing:
                self.timing = np.full(n, None, dtype=object)

    rec = Rec(6, timing=True)
    wire.drive(rec, wire.resolve(url), requests, 1, 5.0, 10.0)
    assert rec.status.tolist() == [200, 200, 201] * 2
    assert rec.timing.tolist() == [b"a;dur=1, b;dur=2", None, b'x;desc="1, 2"'] * 2
    plain = Rec(2, timing=False)
    wire.drive(plain, wire.resolve(url), requests[0], 2, 5.0, 10.0)
    assert plain.status.tolist() == [200, 200] and not hasattr(plain, "timing")
    with pytest.raises(LoadError, match="empty"):
        wire.drive(Rec(1, timing=False), wire.resolve(url), [], 1, 5.0, 10.0)


# -- what is read ------------------------------------------------------------------------

def test_server_timing_milliseconds_become_server_seconds(server):
    url = server.url + "/p"
    body = _spec(timing=['cache;desc="hit; warm, fast", db;dur=2.5', "app;dur=12.5"])
    first = closed_loop(url, body, requests=3, send=Send(response="any"), **BOUNDS)
    named = closed_loop(url, body, requests=3, send=Send(response="any", server_timing="app"), **BOUNDS)
    absent = closed_loop(url, body, requests=3, send=Send(response="any", server_timing="gpu"), **BOUNDS)
    assert first["server_seconds"].tolist() == [0.0025] * 3
    assert named["server_seconds"].tolist() == [0.0125] * 3
    assert absent["server_seconds"].isna().all() and summary(absent)["failed"] == 0
    assert first.attrs["server_timing"] == {"metric": None, "responses": 3, "parsed": 3, "unparsed": 0,
                                            "example": None}
    assert named.attrs["server_timing"]["metric"] == "app"
    assert absent.attrs["server_timing"] == {"metric": "gpu", "responses": 3, "parsed": 0, "unparsed": 0,
                                             "example": None}
    assert summary(named)["server_p50"] == pytest.approx(0.0125)


def test_lab_bodies_win_over_server_timing_and_any_reads_no_body(server):
    url = server.url + "/p"
    stated = _spec(timing=["app;dur=7"], reply={"server_seconds": 0.5, "pid": 42})
    silent = _spec(timing=["app;dur=7"], reply={"pid": 43})
    lab = closed_loop(url, [stated, silent], requests=4, concurrency=1, **BOUNDS)
    assert lab["server_seconds"].tolist() == [0.5, 0.007] * 2 and lab["pid"].tolist() == [42, 43] * 2
    assert lab.attrs["response"] == "lab" and lab.attrs["server_timing"]["parsed"] == 4
    mine = closed_loop(url, [stated, silent], requests=4, concurrency=1, send=Send(response="any"), **BOUNDS)
    assert mine["server_seconds"].tolist() == [0.007] * 4 and (mine["pid"] == -1).all()
    assert mine.attrs["response"] == "any"
    # "lab" wants the lab server's JSON; "any" reads no body at all.
    text = _spec(reply="not an object")
    assert (closed_loop(url, text, requests=1, **BOUNDS)["error"] == "response is not a JSON object").all()
    assert (closed_loop(url, text, requests=1, send=Send(response="any"), **BOUNDS)["error"] == "").all()


def test_an_unparseable_server_timing_is_ignored_and_counted(server):
    bodies = [_spec(timing=["app;dur=3"]), _spec(timing=["app;dur=abc"]), _spec(), _spec(timing=["?!"])]
    frame = closed_loop(server.url + "/p", bodies, requests=8, concurrency=1, send=Send(response="any"), **BOUNDS)
    assert summary(frame)["ok"] == 8
    assert frame["server_seconds"].tolist()[:4] == [0.003] + [pytest.approx(math.nan, nan_ok=True)] * 3
    assert frame.attrs["server_timing"] == {"metric": None, "responses": 6, "parsed": 2, "unparsed": 4,
                                            "example": "app;dur=abc"}


def test_2xx_are_ok_and_other_statuses_fail_with_their_text(server):
    bodies = [_spec(status=s, reply={"error": f"nope {s}"} if s >= 400 else {"done": s}, timing=["app;dur=1"])
              for s in (200, 201, 202, 204, 404, 500)]
    for response in ("lab", "any"):
        frame = closed_loop(server.url + "/p", bodies, requests=6, concurrency=1, send=Send(response=response),
                            **BOUNDS)
        assert frame["status"].tolist() == [200, 201, 202, 204, 404, 500]
        # A 4xx (the server refused the request) says what was sent; a 5xx only what the server said.
        sent = f"POST, Content-Type application/json, a {len(bodies[4])}-byte body"
        assert frame["error"].tolist() == ["", "", "", "", f"HTTP 404 to {sent}: nope 404", "nope 500"]
        s = summary(frame)
        assert (s["ok"], s["failed"]) == (4, 2)
        # Only 2xx responses count towards Server-Timing and server_seconds.
        assert frame.attrs["server_timing"]["responses"] == 4
        assert frame["server_seconds"].notna().tolist() == [True] * 4 + [False] * 2


def test_async_variants_take_what_is_sent(server):
    url = server.url + "/p"
    body = _spec(status=201, timing=["app;dur=2"])

    async def both():
        closed = await aclosed_loop(url, [body, body], requests=3,
                                    send=Send(method="PATCH", response="any", server_timing="app"), **BOUNDS)
        opened = await aopen_loop(url, body, rate=200.0, requests=3,
                                  send=Send(method="PATCH", headers={"X-A": "1"}, response="any"), **BOUNDS)
        return closed, opened

    closed, opened = asyncio.run(both())
    for frame in (closed, opened):
        assert summary(frame)["ok"] == 3 and frame["server_seconds"].tolist() == [0.002] * 3
        assert frame.attrs["method"] == "PATCH" and frame.attrs["bodies"] == 1
    assert {r["method"] for r in server.seen} == {"PATCH"}


# -- refused before anything is sent -----------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"headers": {"Bad Name": "x"}}, "bad header name"),
    ({"headers": {"X:Y": "x"}}, "bad header name"),
    ({"headers": {"": "x"}}, "bad header name"),
    ({"headers": {"X-A": "one\r\nX-Injected: two"}}, "CR, LF"),
    ({"headers": {"X-A": "line\n"}}, "CR, LF"),
    ({"content_type": "text/plain\r\nX: y"}, "CR, LF"),
    ({"headers": {"Content-Length": "5"}}, "written by the load generator"),
    ({"headers": [("host", "example.com")]}, "written by the load generator"),
    ({"headers": [("Transfer-Encoding", "chunked")]}, "written by the load generator"),
    ({"headers": [("CONNECTION", "close")]}, "written by the load generator"),
    ({"headers": [("Content-Type", "a"), ("content-type", "b")]}, "more than once"),
    ({"headers": "X-A: 1"}, "headers must be"),
    ({"headers": [("X-A",)]}, "headers must be"),
    ({"headers": {"X-A": 1}}, "must be str"),
    ({"method": "GE T"}, "method"),
    ({"method": ""}, "method"),
    ({"method": None}, "method"),
])
def test_bad_requests_raise_one_line(kwargs, match):
    url = f"http://127.0.0.1:{_closed_port()}/p"
    with pytest.raises(LoadError, match=match) as info:
        wire.request_bytes(url, b"{}", **{"content_type": "application/json", **kwargs})
    assert isinstance(info.value, TunaError) and "\n" not in str(info.value)
    # The load functions refuse the same before any socket is opened.
    with pytest.raises(LoadError, match=match):
        closed_loop(url, b"{}", requests=1, send=Send(**kwargs))


@pytest.mark.parametrize("kwargs, match", [
    ({"send": Send(response="json")}, "response must be"),
    ({"send": Send(server_timing="two words")}, "server_timing"),
    ({"send": Send(server_timing=3)}, "server_timing"),
    ({"send": {"response": "any"}}, "send must be a Send"),
    ({"body": []}, "empty"),
    ({"body": [b"a", 3]}, "body"),
])
def test_bad_load_arguments_raise_one_line(kwargs, match):
    url = f"http://127.0.0.1:{_closed_port()}/p"
    kwargs = {"body": b"{}", **kwargs}
    for call in (lambda: closed_loop(url, requests=1, **kwargs),
                 lambda: open_loop(url, rate=10.0, requests=1, **kwargs)):
        with pytest.raises(LoadError, match=match) as info:
            call()
        assert "\n" not in str(info.value)


# -- parse_server_timing -----------------------------------------------------------------

@pytest.mark.parametrize("value, metric, expected", [
    ("app;dur=12.3", None, 0.0123),
    (b"app;dur=12.3", None, 0.0123),
    ("db;dur=53, app;dur=47.2", None, 0.053),
    ("db;dur=53, app;dur=47.2", "app", 0.0472),
    ("db;dur=53,app;dur=47.2", "app", 0.0472),
    ('cache;desc="hit, from ; edge", db;dur=2', None, 0.002),
    ('cache;desc="say \\"hi\\", then; go";dur=5', "cache", 0.005),
    ('a;desc="x";dur=1;dur=9', None, 0.001),          # the first dur counts
    ("app ; DUR = 3 ;desc=fast", None, 0.003),         # whitespace, case-insensitive parameter names
    ('app;dur="8"', None, 0.008),                      # a quoted dur
    ("app;dur=0", None, 0.0),
    ("app;dur=1e3", None, 1.0),
    ("miss, cache;desc=hit", None, None),              # no metric has a dur
    ("miss;dur=4", "app", None),                       # no such metric
    ("app, app;dur=6", "app", 0.006),                  # the first of that name with a dur
    ("App;dur=6", "app", None),                        # metric names are compared as they are
    ("", None, None),
    (" , ,", None, None),
    ("total;dur=123.4;desc=\"Total\", db;dur=10", "total", 0.1234),
])
def test_parse_server_timing(value, metric, expected):
    got = parse_server_timing(value, metric)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, rel=1e-12, abs=0)


@pytest.mark.parametrize("value", [
    "app;dur=abc", "app;dur=", "app;dur", "app;dur=-1", "app;dur=nan", "app;dur=inf", "app;dur=1.2.3",
    'app;desc="unterminated', "app;;dur=1", "app dur=1", "?!", "app;dur=1 extra", "db;dur=x, app;dur=1",
    "=1", "app;=1", "app;desc=a b", "app;dur=1e999",
])
def test_parse_server_timing_refuses_garbage(value):
    with pytest.raises(ValueError, match="Server-Timing"):
        parse_server_timing(value, "app")


def _closing_server(answers):
    """A server that answers each connection once, headers and body in two writes 20 ms apart, and closes.

    ``answers`` is a list of (extra header bytes, body bytes), one per connection in turn.
    """
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        for extra, body in answers:
            conn, _ = listener.accept()
            with conn:
                got = b""
                while b"\r\n\r\n" not in got:
                    got += conn.recv(65536)
                head, _, rest = got.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(rest) < length:
                    rest += conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n" + extra
                             + b"Content-Length: %d\r\n\r\n" % len(body))
                threading.Event().wait(0.02)
                conn.sendall(body)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/"


def test_answers_in_two_writes_from_a_closing_server_are_read_whole_even_when_shorter_than_before():
    # The first answers teach drive() a receive low-water mark past their long header block; the later ones
    # are shorter than that mark: the server's close must still wake the loop (no wait for the timeout).
    answers = [(b"X-Pad: " + b"p" * 300 + b"\r\n", b'{"a": 1}')] * 3 + [(b"", b"")] * 3
    url = _closing_server(answers)
    frame = closed_loop(url, b"{}", requests=len(answers), concurrency=1, send=Send(response="any"),
                        **BOUNDS)
    assert frame["status"].tolist() == [200] * len(answers)
    latency = frame["client_seconds"].to_numpy()
    assert (latency >= 0.02).all()            # read only once the body, written 20 ms after the headers, came
    assert (latency < 1.0).all()              # the short answers were not left to the 5 s timeout
