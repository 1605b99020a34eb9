"""The load generator's engine: HTTP/1.1 over non-blocking sockets and one epoll, in one thread.

:mod:`tuna_lab.measure.loadgen.load` decides *what* to send and when (closed or
open loop, bounds, the rows of a trial); this module sends it at the cost of
a C load generator such as wrk, so that the generator takes as little CPU as
possible from the server it measures:

* each request is built once (:func:`request_bytes`: any method, the
  user's own headers), and every send is one ``send`` of the same bytes on
  a keep-alive HTTP/1.1 connection, or on a new one when the server closes
  it (Gunicorn's sync workers close after every response, as wrk's
  connections see too). :func:`drive` sends one request every time, or
  cycles through several (request ``i`` is ``requests[i % len(requests)]``);
* responses are parsed by :func:`parse_response` only as far as it takes to
  know where they end (``Content-Length``, chunked, the connection's close,
  or no body at all for ``HEAD``); their bodies are kept raw and decoded
  after the trial. When asked to, :func:`drive` also keeps each response's
  raw ``Server-Timing`` header value (one search in the header block it has
  already lower-cased), parsed after the trial by
  :func:`tuna_lab.measure.loadgen.server_timing.parse_server_timing`;
* :func:`drive` runs the whole trial in the calling thread on one ``epoll``,
  with no event-loop framework, no tasks and no futures. Open-loop send times
  come from a ``timerfd`` armed at the next scheduled send (nanosecond
  resolution, where epoll's own timeout is rounded to whole milliseconds), so
  the generator neither sleeps past a send time nor spins waiting for it.

The loop described here runs in C (the ``_engine`` extension, :mod:`~tuna_lab.measure.loadgen.native`)
wherever ``pip install`` could compile it; this module's Python loop is what runs where it could not, or
when ``drive(engine="python")`` asks for it, and both write the same rows.

:func:`~tuna_lab.measure.loadgen.trivial.trivial_endpoint` starts a server that answers every request at
once, in a process of its own, to measure the generator rather than a server; the open loop's
clock is :mod:`tuna_lab.measure.loadgen.clock`.

Examples
--------
>>> request = request_bytes("http://127.0.0.1:8000/predict", b'{"rows": [[0.0]]}')
>>> request.splitlines()[0]
b'POST /predict HTTP/1.1'
>>> request_bytes("http://127.0.0.1:8000/health", b"", method="GET", headers={"Accept": "*/*"}).decode()
'GET /health HTTP/1.1\\r\\nHost: 127.0.0.1:8000\\r\\nUser-Agent: tuna-lab\\r\\nAccept: */*\\r\\n\\r\\n'
"""

import errno
import gc
import ipaddress
import os
import re
import select
import socket
import threading
import time
from urllib.parse import urlsplit

import numpy as np

# The C socket type under socket.socket: the same methods without socket.py's
# Python-level constructor and close(), which a new connection per request pays.
from _socket import socket as _RawSocket

from ..._checks import shorten
from ...errors import LoadError
from . import native
from .clock import MAX_WAIT, TimerFd, wake_lag
from .response import parse_buffer, parse_response  # noqa: F401 - parse_response importable from here
from .trivial import serve_trivial, trivial_endpoint

# The last three live in clock.py and trivial.py; they stay importable from here.
__all__ = ["check_url", "request_bytes", "parse_response", "resolve", "drive", "trivial_endpoint", "serve_trivial",
           "wake_lag"]

# Longest error text kept in a request's row.
_ERROR_CHARS = 200
# Bytes asked of the kernel per recv: a small model's response is ~330 bytes,
# a large batch's tens of kB. Received into one buffer allocated per trial:
# sock.recv(n) would allocate n bytes every call, and above glibc's mmap
# threshold (128 kB) that is an mmap, page faults and munmap per response.
_RECV = 262144
# Requests up to this size fit one TCP segment on loopback (MTU 65,536).
_ONE_SEGMENT = 16384
# The epoll event masks this engine uses.
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_READ_EVENTS = _IN | select.EPOLLERR | select.EPOLLHUP
_WRITE_EVENTS = _OUT | select.EPOLLERR | select.EPOLLHUP
# A new connection's socket: non-blocking from its creation (no fcntl).
_STREAM = socket.SOCK_STREAM | socket.SOCK_NONBLOCK
# An HTTP token (RFC 7230 section 3.2.6): a method or a header name.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
# Header values may not break the request's framing: no CR, LF or NUL.
_BAD_VALUE = re.compile(r"[\r\n\0]")
# Headers the generator writes itself (lower-cased): a user's would break the framing.
_OWN_HEADERS = ("host", "content-length", "transfer-encoding", "connection")


def check_url(url):
    """``url`` if it is an ``http://`` URL whose host is a loopback address, else raise LoadError.

    Load tests only ever target a local server: a URL is refused before any
    socket is opened. Loopback means 127.0.0.0/8, ``::1`` or ``localhost``.

    Examples
    --------
    >>> check_url("http://127.0.0.1:8000/predict")
    'http://127.0.0.1:8000/predict'
    >>> check_url("http://example.com/")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.LoadError: refusing to load 'example.com': only loopback hosts (127.0.0.0/8, localhost, ::1) are allowed
    """
    if not isinstance(url, str):
        raise LoadError(f"url must be a string, got {url!r}")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise LoadError(f"malformed url {url!r}: {exc}") from None
    if parts.scheme != "http" or not host:
        # The generator speaks plain HTTP/1.1 (as Gunicorn serves it): no TLS on loopback.
        raise LoadError(f"url must be http://host[:port]/path, got {url!r}")
    if host == "localhost":
        return url
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        # Load tests only ever target a local server: refuse before any socket is opened.
        raise LoadError(f"refusing to load {host!r}: only loopback hosts (127.0.0.0/8, localhost, ::1) are allowed")
    return url


# -- the request and the response --------------------------------------------------------

def request_bytes(url, body, content_type="application/json", method="POST", headers=None):
    """The whole HTTP/1.1 request for ``url`` with ``body``, as the bytes sent every time.

    Parameters
    ----------
    url, body : str, bytes
        ``http://host[:port]/path[?query]`` (checked by the caller); the body.
    content_type, method : str
        The default ``Content-Type`` (None: none); any HTTP method (a token), sent as given.
    headers : dict or sequence of (str, str), optional
        More headers, in order; ``Content-Type`` or ``User-Agent`` here replaces the default.

    Returns
    -------
    bytes

    Raises
    ------
    LoadError
        A bad method, header name or value, or a header the generator writes itself.

    Notes
    -----
    See docs/experiment.md, section "The request on the wire" (which headers are sent, and when).

    Examples
    --------
    >>> r = request_bytes("http://localhost:8000/p?x=1", b"{}")
    >>> r.endswith(b"Content-Length: 2\\r\\n\\r\\n{}"), b"Host: localhost:8000" in r
    (True, True)
    >>> request_bytes("http://localhost:8000/p", b"a=1", method="PUT", headers={"X-Trace": "7"}).split(b"\\r\\n")[:4]
    [b'PUT /p HTTP/1.1', b'Host: localhost:8000', b'User-Agent: tuna-lab', b'X-Trace: 7']
    >>> request_bytes("http://localhost:8000/p", b"", headers={"Content-Length": "0"})   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tuna_lab.errors.LoadError: header 'Content-Length' is written by the load generator itself: ...
    """
    if not isinstance(method, str) or not _TOKEN.match(method):
        raise LoadError(f"method must be an HTTP token such as 'GET' or 'POST', got {shorten(repr(method), 60)}")
    pairs = _header_pairs(headers)
    names = {name.lower() for name, _ in pairs}
    body = bytes(body)
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
    if "user-agent" not in names:
        lines.append("User-Agent: tuna-lab")
    lines.extend(f"{name}: {value}" for name, value in pairs)
    framed = body or method not in ("GET", "HEAD")
    if content_type is not None and framed and "content-type" not in names:
        _check_value("Content-Type", content_type, "content_type")
        lines.append(f"Content-Type: {content_type}")
    if framed:
        lines.append(f"Content-Length: {len(body)}")
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError:
        raise LoadError("the request line and headers must be Latin-1 text (percent-encode the url)") from None
    return head + body


def sent_header(request, name):
    """The value of header ``name`` in the request bytes :func:`request_bytes` built, or None.

    What a refused request is reported with is read back from what was sent.

    Examples
    --------
    >>> sent_header(request_bytes("http://localhost:8000/p", b"{}"), "content-type")
    'application/json'
    >>> sent_header(request_bytes("http://localhost:8000/p", b"", method="GET"), "Content-Type") is None
    True
    """
    head = bytes(request).split(b"\r\n\r\n", 1)[0].decode("latin-1")
    for line in head.split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None


def _header_pairs(headers):
    """``headers`` (None, a dict or (name, value) pairs) as a checked list of str pairs."""
    if headers is None:
        return []
    items = headers.items() if isinstance(headers, dict) else headers
    if isinstance(items, (str, bytes)):
        raise LoadError("headers must be a dict or a sequence of (name, value) pairs, got a string")
    pairs = []
    try:
        for item in items:
            name, value = item
            if not isinstance(name, str) or not isinstance(value, str):
                raise LoadError(f"header names and values must be str, got {shorten(repr(item), 80)}")
            pairs.append((name, value))
    except (TypeError, ValueError):
        raise LoadError("headers must be a dict or a sequence of (name, value) pairs") from None
    types = 0
    for name, value in pairs:
        if not _TOKEN.match(name):
            raise LoadError(f"bad header name {shorten(repr(name), 60)}: a name is an HTTP token "
                            "(letters, digits and !#$%&'*+-.^_`|~)")
        if name.lower() in _OWN_HEADERS:
            raise LoadError(f"header {name!r} is written by the load generator itself: "
                            "Host, Content-Length, Transfer-Encoding and Connection cannot be given")
        _check_value(name, value, "header")
        types += name.lower() == "content-type"
    if types > 1:
        raise LoadError("headers give Content-Type more than once")
    return pairs


def _check_value(name, value, what):
    if not isinstance(value, str):
        raise LoadError(f"{what} {name!r} must be a str, got {type(value).__name__}")
    if _BAD_VALUE.search(value):
        raise LoadError(f"bad value of {what} {name!r}: a header value may not contain CR, LF or NUL")


def resolve(url):
    """The socket family and address to connect to for ``url`` (a checked loopback URL).

    A literal address is used as is. A name (``localhost``) is resolved, and
    of its addresses the first that accepts a connection is taken (a server
    may listen on ``127.0.0.1`` only while ``localhost`` resolves to ``::1``
    first); if none does, the first, so that the requests fail as rows.

    Examples
    --------
    >>> resolve("http://127.0.0.1:8000/predict")
    (<AddressFamily.AF_INET: 2>, ('127.0.0.1', 8000))
    """
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or 80
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise LoadError(f"cannot resolve {host!r}: {exc.strerror}") from None
    candidates = [(family, sockaddr) for family, _, _, _, sockaddr in infos]
    if len(candidates) == 1 or _is_literal(host):
        return candidates[0]
    for family, sockaddr in candidates:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(2.0)
            if probe.connect_ex(sockaddr) == 0:
                return family, sockaddr
    return candidates[0]


def _is_literal(host):
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return True
        except OSError:
            pass
    return False


# -- the engine --------------------------------------------------------------------------

class _Conn:
    """One connection and the request it carries (``i`` = -1 when idle).

    The engine keeps the objects of closed connections and gives them to new ones (one a request
    against a server that closes every connection): ``sock`` and ``fd`` are set when one is taken.
    """

    __slots__ = ("sock", "fd", "i", "buf", "out", "need", "reused", "mask", "served", "head")

    def __init__(self):
        self.sock, self.fd = None, -1
        self.i, self.buf, self.out, self.need, self.reused, self.mask = -1, b"", None, 0, False, 0
        self.served = 0                     # responses read on this connection
        # (status, body start, keep-alive, Server-Timing) of a response whose headers are read and whose
        # Content-Length body is still arriving: Gunicorn sends the headers and the body in two writes,
        # and the second read then only slices the body instead of parsing the headers again.
        self.head = None


def drive(rec, address, request, concurrency, timeout, deadline, schedule=None, reuse=None, engine=None):
    """Run one trial: send one request per row of ``rec``, in this thread; return when done.

    Closed loop without ``schedule``; open loop (request ``i`` due at ``schedule[i]``) with it.

    Parameters
    ----------
    rec : Records
        The trial's per-request arrays (:class:`~tuna_lab.measure.records.Records`), written here.
    address : tuple
        ``(family, sockaddr)`` from :func:`resolve`.
    request : bytes or sequence of bytes
        From :func:`request_bytes`; several are sent in turn.
    concurrency, timeout, deadline, schedule : int, float, float, sequence of float
        Requests in flight at most; seconds per request; the trial's end and send times, from the start.
    reuse : int, optional
        Requests a keep-alive connection carries at most before it is closed and the next goes on a new
        one (None: as many as the server allows). A server whose workers share one listening socket
        gets a connection to whichever worker accepts it; a few long-lived connections may all land on
        one worker, and reconnecting lets the kernel hand them to the others.
    engine : {None, "c", "python"}
        The loop (:mod:`~tuna_lab.measure.loadgen.native`): None runs the C one when it is built. Which
        ran, and why when not the C one, is kept as ``rec.engine``.

    Returns
    -------
    float
        Seconds from the start to the trial's end (the last response or the deadline).

    Notes
    -----
    See docs/load-bench.md, section "How the generator keeps its cost down" (what ``rec`` gets).

    Examples
    --------
    >>> # skipped: needs a recorder and a server's URL
    >>> end = drive(rec, resolve(url), request_bytes(url, body), 8, 30.0, 60.0)   # doctest: +SKIP
    """
    name, why = native.choose(engine)
    requests = _request_tuple(request)
    rec.engine = {"engine": name, "engine_why": why}
    _pause_gc()
    try:
        if name == "c":
            return native.run(rec, address, requests, concurrency, timeout, deadline, schedule, reuse)
        return _Engine(rec, address, requests, concurrency, timeout, deadline, schedule, reuse).run()
    finally:
        _resume_gc()


def _request_tuple(request):
    """``request`` (bytes, or a non-empty sequence of them) as a tuple of bytes; else LoadError."""
    if isinstance(request, (bytes, bytearray, memoryview)):
        return (bytes(request),)
    try:
        requests = tuple(bytes(r) for r in request)
    except TypeError:
        raise LoadError("request must be bytes or a sequence of bytes (see request_bytes())") from None
    if not requests:
        raise LoadError("request must not be an empty sequence")
    return requests


# The cyclic garbage collector is off while any trial runs (as timeit does): a full collection walks
# every object of the process, and in a large one (pandas, a test session) it held the GIL for tens of
# ms in the middle of a trial, stalling the sends and charging the walk to the generator's thread.
# The trial itself makes next to no cyclic garbage. Trials may overlap (several generator threads):
# the collector comes back when the last ends, and only if it was on when the first began.
_gc_lock = threading.Lock()
_gc_state = {"trials": 0, "was_enabled": False}


def _pause_gc():
    with _gc_lock:
        if _gc_state["trials"] == 0:
            _gc_state["was_enabled"] = gc.isenabled()
            gc.disable()
        _gc_state["trials"] += 1


def _resume_gc():
    with _gc_lock:
        _gc_state["trials"] -= 1
        if _gc_state["trials"] == 0 and _gc_state["was_enabled"]:
            gc.enable()


class _Engine:
    def __init__(self, rec, address, request, concurrency, timeout, deadline, schedule, reuse=None):
        self.rec = rec
        self.reuse = reuse
        # Python lists while the trial runs (a list store is cheaper than a numpy
        # scalar store); copied into rec's arrays when it ends.
        self.sent, self.done = rec.sent.tolist(), rec.done.tolist()
        self.status, self.raw, self.error = rec.status.tolist(), list(rec.raw), list(rec.error)
        self.scheduled = rec.scheduled.tolist()
        self.family, self.sockaddr = address
        requests = _request_tuple(request)
        # One request: sent as is every time; several: request i is cycle[i % len(cycle)].
        self.request = requests[0]
        self.cycle = requests if len(requests) > 1 else None
        heads = tuple(r.startswith(b"HEAD ") for r in requests)
        self.heads = heads if any(heads) else None
        # Server-Timing values are kept only when rec has somewhere to put them.
        self.timing = None if getattr(rec, "timing", None) is None else [None] * len(rec.status)
        # A request in one segment (loopback's MSS is ~64 kB) goes out at once,
        # Nagle or not (nothing unacknowledged precedes it): spare the syscall.
        self.nodelay = max(len(r) for r in requests) > _ONE_SEGMENT
        # SO_RCVLOWAT for new connections (0: not set; -1: never). A server that closes every
        # connection after its answer (Gunicorn's sync workers) writes the headers and the body in two
        # sends; a low-water mark one byte past the shortest header block seen keeps epoll from waking
        # the loop for the headers alone (a wake, a recv and a parse saved per request). It is safe
        # only there: should an answer be shorter, the server's close still wakes the loop. One
        # answer kept alive turns it off for the trial.
        self.lowat = 0 if self.heads is None else -1    # a HEAD's answer is its headers alone
        self.slots = concurrency
        self.timeout = timeout
        self.deadline = deadline
        self.schedule = None if schedule is None else [float(t) for t in schedule]
        self.n = len(rec.status)
        self.ep = select.epoll()
        self.conns = {}                     # fd -> _Conn, busy or idle
        self.idle = []                      # idle keep-alive connections
        self.spare = []                     # _Conn objects of closed connections, for new ones
        self.busy = 0                       # requests in flight
        # Requests are sent in index order and every one has the same timeout, so the oldest request
        # in flight (the lowest i still in flight) is the next to time out: no queue of timeouts.
        self.oldest = 0
        self.nxt = 0                        # the next request to send
        self.in_flight = bytearray(self.n)  # 1 while request i is in flight
        self.clock = time.monotonic
        self.t0 = 0.0
        self.view = memoryview(bytearray(_RECV))

    # -- life of a request -------------------------------------------------------------

    def _connect(self, i):
        try:
            sock = _RawSocket(self.family, _STREAM)
        except OSError as exc:
            self._fail(None, i, f"socket: {exc.strerror or exc}")
            return
        if self.nodelay:
            # A request of several segments must not wait for an ACK (Nagle).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.lowat > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, self.lowat)
        err = sock.connect_ex(self.sockaddr)
        spare = self.spare
        conn = spare.pop() if spare else _Conn()
        conn.sock = sock
        conn.fd = fd = sock.fileno()
        conn.i = i
        conn.reused = False
        self.conns[fd] = conn
        if err == 0 or err == errno.EINPROGRESS:
            # On loopback the handshake has usually completed by now: send at
            # once, and wait for writability only if the socket is not ready.
            # The usual case (all of it sent) inline: _send and _watch are two
            # calls per request otherwise.
            out = self.request if self.cycle is None else self.cycle[i % len(self.cycle)]
            try:
                sent = sock.send(out)
            except OSError:
                sent = -1     # _send tries again and tells the errors apart
            if sent == len(out):
                self.ep.register(fd, _IN)
                conn.mask = _IN
            else:
                if sent > 0:
                    conn.out = memoryview(out)[sent:]
                self._send(conn, connecting=True)
        else:
            self._fail(conn, i, f"connect: {os.strerror(err)}")

    def _watch(self, conn, mask):
        if conn.mask == mask:
            return
        if conn.mask:
            self.ep.modify(conn.fd, mask)
        else:
            self.ep.register(conn.fd, mask)
        conn.mask = mask

    def _send(self, conn, connecting=False):
        out = conn.out
        if out is None:
            out = self.request if self.cycle is None else self.cycle[conn.i % len(self.cycle)]
        try:
            sent = conn.sock.send(out)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            if connecting and exc.errno in (errno.ENOTCONN, errno.EAGAIN):
                sent = 0
            elif connecting:
                self._fail(conn, conn.i, f"connect: {exc.strerror or exc}")
                return
            else:
                self._broken(conn, f"send: {exc.strerror or exc}")
                return
        if sent == len(out):
            conn.out = None
            self._watch(conn, _IN)
        else:
            conn.out = memoryview(out)[sent:] if sent else out
            self._watch(conn, _OUT)

    def _writable(self, conn):
        err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            if conn.reused:
                self._broken(conn, f"send: {os.strerror(err)}")
            else:
                self._fail(conn, conn.i, f"connect: {os.strerror(err)}")
            return
        self._send(conn)

    def _readable(self, conn):
        """Read what ``conn`` has; at a response's end, its row (the usual path, inline: once a request)."""
        try:
            got = conn.sock.recv_into(self.view)
        except BlockingIOError:
            return
        except OSError as exc:
            self._broken(conn, f"recv: {exc.strerror or exc}")
            return
        i = conn.i
        if i < 0:
            # An idle keep-alive connection the server closed (or wrote to): drop it.
            self._close(conn)
            self.idle.remove(conn)
            return
        if not got:
            if not conn.buf:
                self._broken(conn, "server closed the connection without a response")
            else:
                self._parse(conn, conn.buf, eof=True)
            return
        buf = conn.buf
        if buf:
            if buf.__class__ is bytes:
                buf = conn.buf = bytearray(buf)
            buf += self.view[:got]
            need = conn.need
            if need:
                if len(buf) < need:
                    return  # a long body still arriving: no need to parse the headers again
                head = conn.head
                if head is not None:
                    status, start, keep, st = head
                    conn.head = None
                    self._answered(conn, buf, status, bytes(buf[start:need]), need, keep, st, False, start)
                    return
        else:
            buf = conn.buf = self.view[:got].tobytes()
        # _parse(conn, buf, eof=False), inline: once or twice per request.
        heads = self.heads
        try:
            parsed = parse_buffer(buf, False, heads is not None and heads[i % len(heads)], self.timing is not None)
        except ValueError as exc:
            self._fail(conn, i, f"bad response: {exc}")
            return
        if parsed is None:
            return
        status, body, end, keep, st, start = parsed
        if body is None:
            if end > 0:
                conn.need, conn.head = end, (status, start, keep, st)
            else:
                conn.need = 0
            return
        # _answered(conn, buf, status, body, end, keep, st, False, start), inline: once per request.
        lowat = self.lowat
        if lowat >= 0:
            if keep:
                self.lowat = -1
            elif end > start and (lowat == 0 or start < lowat - 1):
                self.lowat = start + 1
        self.done[i] = self.clock() - self.t0
        self.status[i] = status
        self.raw[i] = body
        if st is not None:
            self.timing[i] = st
        self.in_flight[i] = 0
        self.busy -= 1
        if keep and end == len(buf) and (self.reuse is None or conn.served + 1 < self.reuse):
            conn.served += 1
            conn.i, conn.buf, conn.need, conn.out = -1, b"", 0, None
            self.idle.append(conn)
        else:
            # _close(conn), inline, and the object kept for the next connection.
            del self.conns[conn.fd]
            conn.sock.close()
            conn.i, conn.buf, conn.need, conn.mask, conn.served = -1, b"", 0, 0, 0
            self.spare.append(conn)

    def _parse(self, conn, buf, eof):
        heads, timing = self.heads, self.timing
        try:
            parsed = parse_buffer(buf, eof, heads is not None and heads[conn.i % len(heads)], timing is not None)
        except ValueError as exc:
            self._fail(conn, conn.i, f"bad response: {exc}")
            return
        if parsed is None:
            return
        status, body, end, keep, st, start = parsed
        if body is None:
            if end > 0:
                conn.need, conn.head = end, (status, start, keep, st)
            else:
                conn.need = 0
            return
        self._answered(conn, buf, status, body, end, keep, st, eof, start)

    def _answered(self, conn, buf, status, body, end, keep, st, eof, start=0):
        """Response ``status``, ``body`` (from ``start`` to ``end`` of ``buf``) has arrived on ``conn``: its row."""
        lowat = self.lowat
        if lowat >= 0:
            if keep:
                self.lowat = -1
            elif end > start and (lowat == 0 or start < lowat - 1):
                self.lowat = start + 1
        i = conn.i
        self.done[i] = self.clock() - self.t0
        self.status[i] = status
        self.raw[i] = body
        if st is not None:
            self.timing[i] = st
        self._finished(i)
        conn.served += 1
        if keep and end == len(buf) and not eof and (self.reuse is None or conn.served < self.reuse):
            conn.i, conn.buf, conn.need, conn.out, conn.head = -1, b"", 0, None, None
            self.idle.append(conn)
        else:
            self._close(conn)

    def _broken(self, conn, why):
        """The connection failed: resend once on a new one if it was a kept-alive one the server
        had closed before it saw the request; else the request fails."""
        i = conn.i
        if conn.reused and not conn.buf and i >= 0:
            self._close(conn)
            self._connect(i)
            return
        self._fail(conn, i, why)

    def _fail(self, conn, i, why):
        if conn is not None:
            self._close(conn)
        self.done[i] = self.clock() - self.t0
        self.status[i] = -1
        self.error[i] = shorten(why, _ERROR_CHARS)
        self._finished(i)

    def _finished(self, i):
        self.in_flight[i] = 0
        self.busy -= 1

    def _close(self, conn):
        self.conns.pop(conn.fd, None)
        conn.i = -1
        # Closing the last descriptor of a socket also removes it from the epoll set.
        conn.sock.close()

    def _expire(self, now):
        """Fail the requests whose timeout is past; when the next one is due (None: none in flight)."""
        in_flight, sent, nxt = self.in_flight, self.sent, self.nxt
        i, timeout = self.oldest, self.t0 + self.timeout
        while i < nxt:
            if not in_flight[i]:
                i += 1                  # finished before its timeout
                continue
            when = sent[i] + timeout
            if when > now:
                self.oldest = i
                return when
            conn = next((c for c in self.conns.values() if c.i == i), None)
            self._fail(conn, i, "timeout")
            i += 1
        self.oldest = i
        return None

    # -- the loop ------------------------------------------------------------------------

    def run(self):
        timer = TimerFd() if self.schedule is not None else None
        try:
            if timer is not None:
                # Edge-triggered: each expiry wakes the loop once, with no read() to clear it.
                self.ep.register(timer.fd, _IN | select.EPOLLET)
            return self._loop(timer)
        finally:
            for conn in list(self.conns.values()):
                conn.sock.close()
            self.conns.clear()
            self.ep.close()
            if timer is not None:
                timer.close()
            rec, n = self.rec, self.n
            # fromiter: one C loop each, where assigning a list to an array first inspects every item as
            # a possible sequence (callgrind: ~2k instructions a request at the end of a trial).
            rec.sent[:], rec.done[:] = np.fromiter(self.sent, float, n), np.fromiter(self.done, float, n)
            rec.status[:] = np.fromiter(self.status, rec.status.dtype, n)
            rec.scheduled[:] = np.fromiter(self.scheduled, float, n)
            rec.origin = self.t0   # the clock's start: a server's CLOCK_MONOTONIC times line up with the sends
            # An object array's items are the list's bytes and str as they are.
            rec.raw[:], rec.error[:] = np.fromiter(self.raw, object, n), np.fromiter(self.error, object, n)
            if self.timing is not None:
                rec.timing[:] = np.fromiter(self.timing, object, n)

    def _loop(self, timer):
        clock, conns, schedule, sent, scheduled = self.clock, self.conns, self.schedule, self.sent, self.scheduled
        in_flight, idle, poll, readable = self.in_flight, self.idle, self.ep.poll, self._readable
        n, slots, timeout = self.n, self.slots, self.timeout
        self.t0 = t0 = clock()
        stop = t0 + self.deadline
        nxt = 0  # the next request to send
        due = None
        while True:
            now = clock()
            # Send what may go now. The usual path of _start inline: once per request.
            while nxt < n and self.busy < slots and (schedule is None or t0 + schedule[nxt] <= now):
                i = nxt
                nxt += 1
                t = sent[i] = now - t0
                if schedule is None:
                    scheduled[i] = t
                self.busy += 1
                in_flight[i] = 1
                if idle:
                    conn = idle.pop()
                    conn.reused = True
                    conn.i = i
                    self._send(conn)
                else:
                    self._connect(i)
                now = clock()
            self.nxt = nxt
            if nxt >= n and self.busy == 0:
                return now - t0
            if now >= stop:
                return now - t0
            # The oldest request in flight bounds the wait (its timeout); the scan past finished or timed-out
            # requests runs only once that time is due (a wake for one that already finished is harmless).
            oldest = self.oldest
            if oldest < nxt:
                due = sent[oldest] + t0 + timeout
                if due <= now:
                    self._expire(now)
                    continue  # the slots it freed: send, or end the trial, before any wait (was up to 1 s)
            else:
                due = None
            wake = stop if due is None or due > stop else due
            if schedule is not None and nxt < n and self.busy < slots:
                due = t0 + schedule[nxt]
                timer.arm(due)
                # The timerfd wakes the loop at the send time; epoll's own
                # timeout (whole ms, rounded up) only bounds the timeouts.
                if due + 0.001 < wake:
                    wake = due + 0.001
            wait = wake - now
            for fd, ev in poll(wait if 0.0 < wait < MAX_WAIT else (MAX_WAIT if wait > 0.0 else 0.0)):
                conn = conns.get(fd)
                if conn is None:
                    continue  # the timer, or a socket closed earlier in this batch
                if conn.out is not None and ev & _WRITE_EVENTS:
                    self._writable(conn)
                elif ev & _READ_EVENTS:
                    readable(conn)
