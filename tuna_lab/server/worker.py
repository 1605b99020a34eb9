"""The lab server's Gunicorn worker: requests read whole, without a worker, then served on the main thread.

Gunicorn's sync worker gives a worker to a connection as soon as it accepts
it, and reads the request with blocking calls: a connection that sends
nothing, or one byte a second, holds that worker. With a read deadline per
connection (the worker before this one) each still held it for the whole
deadline, so 40 idle sockets kept ``serve -w 2`` from answering for about
100 s (40 x 5 s over 2 workers), and 10 slow senders kept ``/healthz``
waiting 20-23 s.

:class:`LabWorker` reads instead with a selector, in the worker's one
thread: it accepts a connection, reads whatever bytes are there without
waiting, and keeps each connection whose request is not whole in a table,
with its bytes, until the request is complete; only then does it hand the
buffered bytes to Gunicorn's own HTTP parser and call the app - on the main
thread, which tuna_lab pins with the OpenMP pool (a threaded or async
worker would call the app from another thread). Each connection is bounded:

* in **time**: the whole request (headers and body) must arrive within
  ``read_timeout`` seconds of the accept, a deadline for the request, not a
  timeout per read; the time the worker spends serving other requests (when
  it reads nobody's bytes) is not counted. A connection whose headers are
  still missing then is closed; one whose body is missing goes to the app,
  which answers 408;
* in **size**: the headers may be as large as Gunicorn's own limits allow
  (then its parser answers); a ``Content-Length`` over the app's body cap
  goes to the app at once, which answers 413 without reading the body; a
  chunked body whose framed bytes pass the cap gets 413 here;
* in **number and memory**: at most :data:`MAX_PENDING` connections wait for
  their bytes in one worker (the oldest is closed to make room for a new
  one), and their buffers together hold at most :data:`BUFFER_BUDGET_BODIES`
  bodies' worth; past that the worker reads only the first 64 KiB of each
  (so that small requests still come in) until room frees (their deadlines
  still run).

A complete request is served as soon as it is complete, one at a time, so
a worker takes no more work than the sync worker did: the queue stays in
the listening socket, where any free worker takes it. Each request's wait
for a worker is told to the app (:func:`waited`) for load shedding.
Gunicorn's arbiter is notified every turn of the loop (at least every half
``timeout``), and ``max_requests``, graceful stops and a dead parent end
the loop as in the sync worker; a worker that stops gracefully (or after
``max_requests``) first answers the connections it took, each by its
deadline, and takes no new one.
"""

import errno
import os
import selectors
import socket
import struct
import time
from http import HTTPStatus

from gunicorn import util
from gunicorn.http.errors import NoMoreData
from gunicorn.workers.sync import SyncWorker

from .limits import MAX_BODY_BYTES, READ_TIMEOUT

__all__ = ["LabWorker", "ReadTimeout", "waited", "MAX_PENDING", "BUFFER_BUDGET_BODIES"]

#: Most connections one worker keeps waiting for the rest of their requests.
MAX_PENDING = 512
#: The buffers of those connections hold at most this many body caps (plus headers) together.
BUFFER_BUDGET_BODIES = 2
#: Bytes asked of the kernel per read; a few reads per connection and turn, so one sender cannot starve the others.
_RECV = 1 << 20
_READS_PER_TURN = 4
#: What a connection may still buffer when the buffers are full (MAX_PENDING x this at most, beyond the budget).
_SMALL = 1 << 16
#: Connections accepted per turn before the loop looks at the others again.
_ACCEPTS_PER_TURN = 16
#: How long, after its answer, a connection is drained before it is closed (Gunicorn lingers up to 2 s).
_DRAIN_SECONDS = 0.25
#: Bytes of a chunk-size line (hex size and extensions) beyond which the worker refuses the request (400).
_CHUNK_LINE = 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# struct tcp_info (linux/tcp.h): 8 one-byte fields, then 32-bit ones; the 12th of those,
# tcpi_last_data_recv, is the milliseconds since the connection last received data.
_TCP_INFO = struct.Struct("8B24I")
_LAST_DATA_RECV = 8 + 11


# ... and the 5th of them, tcpi_unacked, is on a listening socket the length of its accept queue.
_ACCEPT_QUEUE = 8 + 4


def _accept_queue(listener):
    """Connections waiting in the listening socket ``listener`` to be accepted (Linux ``TCP_INFO``); None elsewhere."""
    try:
        info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
        return _TCP_INFO.unpack(info)[_ACCEPT_QUEUE]
    except (AttributeError, OSError, struct.error):
        return None


class ReadTimeout(NoMoreData, TimeoutError):
    """A connection's request did not arrive by its deadline.

    A :class:`~gunicorn.http.errors.NoMoreData` to Gunicorn (a client gone:
    the connection is closed without a traceback in its log) and a
    :class:`TimeoutError` to the app (a body still missing: 408).
    """

    def __init__(self, seconds):
        super().__init__(b"")
        self.errno, self.seconds = errno.ETIMEDOUT, seconds

    def __str__(self):
        return f"request not received within {self.seconds:g} s"


def waited(conn):
    """Seconds since the accepted connection ``conn`` last received data (Linux ``TCP_INFO``); None elsewhere.

    Taken as its request, complete, is handed to the app, it is how long the
    request waited for a worker (to the kernel's tick: 1-10 ms).

    Examples
    --------
    >>> server = socket.create_server(("127.0.0.1", 0))
    >>> client = socket.create_connection(server.getsockname()); client.sendall(b"GET")
    >>> time.sleep(0.3); conn, _ = server.accept()
    >>> 0.25 <= waited(conn) < 1
    True
    >>> for s in (conn, client, server): s.close()
    """
    try:
        info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
        return _TCP_INFO.unpack(info)[_LAST_DATA_RECV] / 1000
    except (AttributeError, OSError, struct.error):   # not Linux, not TCP (a Unix socket)
        return None


class _Connection(socket.socket):
    """A connection handed to Gunicorn: its buffered request first, then reads that all end by its deadline.

    Writes each get ``read_timeout``, so that a client that never reads its
    answer does not hold the worker either.
    """

    def __init__(self, client, read_timeout, deadline, buffered=b"", continued=False, expired=False):
        super().__init__(client.family, client.type, client.proto, fileno=client.detach())
        self.read_timeout, self.deadline = read_timeout, deadline
        # A request cut at its deadline waited for its client, not for a worker: it is never shed.
        self.waited = 0.0 if expired else waited(self)
        self._buffered, self._pos = memoryview(buffered), 0
        self.timed_out = self.answered = False
        self._drain_until = None
        self._continued = continued

    def send(self, data, flags=0):
        if self._continued and bytes(data) == _CONTINUE:
            return len(data)          # sent already, while the worker waited for the body
        return super().send(data, flags)

    def recv(self, bufsize, flags=0):
        if self._pos < len(self._buffered):
            data = self._buffered[self._pos:self._pos + bufsize].tobytes()
            self._pos += len(data)
            return data
        if self.answered:
            # Gunicorn draining the connection before it closes it: briefly, the worker is not the client's.
            left = self._drain_until - time.monotonic()
            if left <= 0:
                return b""
            self.settimeout(left)
            return super().recv(bufsize, flags)
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.timed_out = True
            raise ReadTimeout(self.read_timeout)
        self.settimeout(left)
        try:
            return super().recv(bufsize, flags)
        except TimeoutError:
            self.timed_out = True
            raise ReadTimeout(self.read_timeout) from None

    def sendall(self, data, flags=0):
        self.settimeout(self.read_timeout)
        if not self.answered:
            self.answered = True
            self._drain_until = time.monotonic() + _DRAIN_SECONDS
        return super().sendall(data, flags)


class _Pending:
    """One accepted connection and the bytes of its request so far; says when the request is whole.

    :meth:`feed` answers one of ``"more"`` (wait for bytes), ``"whole"``
    (hand it over), ``"handover"`` (hand it over now: framing or headers
    Gunicorn's parser should judge, or a ``Content-Length`` the app refuses
    unread), ``"too large"`` (a chunked body past the cap) or ``"bad chunk"``
    (a chunk-size line longer than any real one: Gunicorn's parser would
    wait for up to 8190 bytes of it, holding the worker).
    """

    __slots__ = ("sock", "addr", "listener", "deadline", "buf", "head_end", "length", "chunk_pos", "expect",
                 "continued")

    def __init__(self, sock, addr, listener, deadline):
        self.sock, self.addr, self.listener, self.deadline = sock, addr, listener, deadline
        self.buf = bytearray()
        self.head_end = None       # index just past the blank line ending the headers
        self.length = None         # bytes of the body (Content-Length); None: chunked
        self.chunk_pos = None      # where the next chunk-size line starts
        self.expect = self.continued = False   # the client waits for "100 Continue"; it was sent

    def feed(self, data, head_cap, body_cap):
        seen = len(self.buf)
        self.buf += data
        if self.head_end is None:
            end = self.buf.find(b"\r\n\r\n", max(0, seen - 3))
            if end < 0:
                return "handover" if len(self.buf) > head_cap else "more"
            self.head_end = end + 4
            framing, self.expect = _framing(bytes(self.buf[:end]))
            if framing is None or (framing != "chunked" and framing > body_cap):
                return "handover"
            if framing == "chunked":
                self.chunk_pos = self.head_end
            else:
                self.length = framing
                self.expect = self.expect and framing > 0
        if self.length is not None:
            return "whole" if len(self.buf) >= self.head_end + self.length else "more"
        if len(self.buf) - self.head_end > body_cap + _CHUNK_LINE:
            return "too large"
        return self._walk_chunks()

    def _walk_chunks(self):
        buf, pos = self.buf, self.chunk_pos
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                # Handed over, an unfinished line would have Gunicorn's parser read on (up to its 8190 bytes),
                # blocking this worker for read_timeout: a slowloris by chunk line.
                return "bad chunk" if len(buf) - pos > _CHUNK_LINE else "more"
            try:
                size = int(bytes(buf[pos:eol]).split(b";", 1)[0].strip(), 16)
            except ValueError:
                return "handover"        # Gunicorn's parser refuses the framing with its reason
            if size == 0:
                # Trailers, if any, end with a blank line.
                if buf[eol + 2:eol + 4] == b"\r\n" or buf.find(b"\r\n\r\n", eol) >= 0:
                    return "whole"
                return "more"
            pos = eol + 2 + size + 2
            if len(buf) < pos:
                return "more"
            self.chunk_pos = pos


def _framing(head):
    """``(body, expect)`` of request headers ``head``.

    ``body``: the body's bytes (``Content-Length``, 0 without), ``"chunked"``,
    or None where Gunicorn's parser should judge (and refuse) the framing;
    ``expect``: whether an HTTP/1.1 client waits for ``100 Continue``.
    """
    lines = head.split(b"\r\n")
    length, chunked, lengths, expect = 0, False, 0, False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            return None, False
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            lengths += 1
            if not value.isdigit():
                return None, False
            length = int(value)
        elif name == b"transfer-encoding":
            if not value.endswith(b"chunked"):
                return None, False
            chunked = True
        elif name == b"expect":
            expect = value == b"100-continue" and lines[0].endswith(b"HTTP/1.1")
    if lengths > 1 or (chunked and lengths):
        return None, False
    return ("chunked" if chunked else length), expect


class LabWorker(SyncWorker):
    """Gunicorn's sync worker that reads requests whole without blocking, and serves them on its main thread.

    Gunicorn loads it by name (``worker_class``); the bounds are the app's
    (``read_timeout``, ``max_body_bytes``, ``max_wait``), so the app's
    environment variables set them.
    """

    def run(self):
        if self.cfg.is_ssl:
            # TLS needs its handshake on the socket; the lab server binds 127.0.0.1 without TLS.
            return super().run()
        self._read_timeout = float(getattr(self.wsgi, "read_timeout", READ_TIMEOUT))
        self._body_cap = int(getattr(self.wsgi, "max_body_bytes", MAX_BODY_BYTES))
        self._head_cap = _head_cap(self.cfg)
        self._budget = BUFFER_BUDGET_BODIES * (self._body_cap + self._head_cap)
        self._buffered = 0
        self._pending = {}        # fd -> _Pending, oldest first
        self._paused = {}         # fd -> _Pending not read for want of buffer room
        self._sel = selectors.DefaultSelector()
        try:
            self._sel.register(self.PIPE[0], selectors.EVENT_READ, None)
            for listener in self.sockets:
                listener.setblocking(False)
                self._sel.register(listener, selectors.EVENT_READ, listener)
            self._loop()
            self._finish()
        finally:
            for p in [*self._pending.values(), *self._paused.values()]:
                self._close(p)
            self._sel.close()
        return None

    def _loop(self):
        while self.alive:
            self.notify()
            timeout = self.timeout or 0.5
            waiting = [*self._pending.values(), *self._paused.values()]
            if waiting:
                timeout = max(0.0, min(timeout, min(p.deadline for p in waiting) - time.monotonic()))
            for key, _ in self._sel.select(timeout):
                if not self.alive:
                    break
                if key.data is None:
                    try:
                        os.read(self.PIPE[0], 64)
                    except BlockingIOError:
                        pass
                elif isinstance(key.data, _Pending):
                    if key.data.sock.fileno() in self._pending:
                        self._read(key.data)
                else:
                    self._accept(key.data)
            self._expire()
            if not self.is_parent_alive():
                return

    def _finish(self):
        """After a graceful stop or ``max_requests``: serve the connections this worker took, until their deadlines.

        The sync worker took no connection it would not serve; these were
        accepted, so they are answered here rather than reset. No new ones are
        taken: they wait in the listening socket for the other workers or the
        replacement. Each gets ``read_timeout`` of the worker's reading (its time serving the others is
        not counted), all of it under Gunicorn's ``graceful_timeout``, which ends the worker.
        """
        for listener in self.sockets:
            self._sel.unregister(listener)
        while self._pending or self._paused:
            if not self.is_parent_alive():
                return
            self.notify()
            left = min(p.deadline for p in (*self._pending.values(), *self._paused.values())) - time.monotonic()
            for key, _ in self._sel.select(max(0.0, min(left, 1.0))):
                if isinstance(key.data, _Pending) and key.data.sock.fileno() in self._pending:
                    self._read(key.data)
                elif key.data is None:
                    try:
                        os.read(self.PIPE[0], 64)
                    except BlockingIOError:
                        pass
            self._expire()

    def _accept(self, listener):
        # A share of what waits in the listening socket, not all of it: a burst's requests are seldom whole at
        # accept (a body of several segments), so a worker that took every connection there left the others
        # idle while it served them one by one (one worker measured in 5 of 6 trials of `run -w 2 --requests
        # 10`). The other workers, woken by the same socket, take the rest. Under overload a share is still
        # many, which is how a queued request's wait is seen (TCP_INFO) and shed.
        queued = _accept_queue(listener)
        turn = _ACCEPTS_PER_TURN if queued is None else min(_ACCEPTS_PER_TURN,
                                                             max(1, -(-queued // max(1, self.cfg.workers))))
        for _ in range(turn):
            if not self.alive:
                return
            self.notify()               # each request served here may take up to the work bound
            try:
                client, addr = listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                    return
                raise
            util.close_on_exec(client)
            client.setblocking(False)
            if len(self._pending) + len(self._paused) >= MAX_PENDING:
                # The oldest is nearest its deadline and has sent the least of what it owes.
                oldest = next(iter(self._pending.values()), None) or next(iter(self._paused.values()))
                self._drop(oldest, "too many connections waiting for their requests; closed the oldest")
            p = _Pending(client, addr, listener, time.monotonic() + self._read_timeout)
            self._pending[client.fileno()] = p
            self._sel.register(client, selectors.EVENT_READ, p)
            # Most clients send their whole request at once: it is there already, serve it now.
            self._read(p)

    def _read(self, p):
        for _ in range(_READS_PER_TURN):
            size = _RECV
            if self._buffered >= self._budget:
                # Full: large bodies wait, but a request's first bytes (a /healthz, say) are still read.
                size = _SMALL - len(p.buf)
                if size <= 0:
                    self._pause(p)
                    return
            try:
                data = p.sock.recv(size)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(p)
                return
            if not data:
                self._close(p)             # gone before its request was whole
                return
            self._buffered += len(data)
            state = p.feed(data, self._head_cap, self._body_cap)
            if state == "too large":
                self._refuse(p, 413, f"body exceeds the limit of {self._body_cap} bytes")
                return
            if state == "bad chunk":
                self._refuse(p, 400, f"chunk-size line longer than {_CHUNK_LINE} bytes")
                return
            if state != "more":
                self._serve(p)
                return
            if p.expect and not p.continued:
                # The client waits for this before it sends its body (curl: up to 1 s); Gunicorn's own would come
                # only once the body is here.
                p.continued = True
                try:
                    p.sock.send(_CONTINUE)
                except OSError:
                    pass
            if len(data) < size:
                return

    def _expire(self):
        now = time.monotonic()
        for p in [p for p in (*self._pending.values(), *self._paused.values()) if p.deadline <= now]:
            if p.head_end is not None:
                self._serve(p, expired=True)   # headers whole, body missing: the app answers 408
            else:
                self._drop(p, str(ReadTimeout(self._read_timeout)))

    def _forget(self, p):
        fd = p.sock.fileno()
        if self._pending.pop(fd, None) is not None:
            self._sel.unregister(p.sock)
        self._paused.pop(fd, None)
        self._buffered -= len(p.buf)
        if self._paused and self._buffered < self._budget:
            for q in list(self._paused.values()):
                self._paused.pop(q.sock.fileno())
                self._pending[q.sock.fileno()] = q
                self._sel.register(q.sock, selectors.EVENT_READ, q)

    def _pause(self, p):
        fd = p.sock.fileno()
        if self._pending.pop(fd, None) is not None:
            self._sel.unregister(p.sock)
            self._paused[fd] = p

    def _close(self, p):
        self._forget(p)
        p.sock.close()

    def _drop(self, p, why):
        self.log.warning("closed the connection of %s: %s", p.addr[0] if p.addr else "?", why)
        self._close(p)

    def _refuse(self, p, status, reason):
        """Answer a request the worker itself refuses (before the app could), and close."""
        self._forget(p)
        body = ('{"error": "%s"}' % reason).encode()
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        self.log.warning("refused the request of %s: %s", p.addr[0] if p.addr else "?", reason)
        try:
            p.sock.settimeout(self._read_timeout)
            p.sock.sendall(head + body)
        except OSError:
            pass
        p.sock.close()

    def _serve(self, p, expired=False):
        """Hand a request, whole (or past its deadline), to Gunicorn's parser and the app, on this thread."""
        self._forget(p)
        buffered, p.buf = p.buf, bytearray()
        conn = _Connection(p.sock, self._read_timeout, p.deadline, buffered, p.continued, expired)
        started = time.monotonic()
        self.handle(p.listener, conn, p.addr)
        # A deadline bounds its client's sending, not this worker's turn at other requests: while it served this
        # one it read none of the others' bytes, and a body larger than a socket holds cannot arrive unread. So
        # that time is not counted against them. Counted from the accept, a burst of large bodies to a busy
        # worker ran out of time waiting for the worker (408 for a third of `sweep --grid article`'s 1,000
        # requests at 16 x 1 on 2 CPUs). An idle or slow client still has read_timeout of the worker's reading.
        busy = time.monotonic() - started
        for q in (*self._pending.values(), *self._paused.values()):
            q.deadline += busy
        if conn.timed_out:
            self.log.warning("closed the connection of %s: %s", p.addr[0] if p.addr else "?",
                             ReadTimeout(self._read_timeout))


def _head_cap(cfg):
    """Most bytes of request line and headers Gunicorn's own limits allow (its parser refuses more, with a reason)."""
    line = cfg.limit_request_line or 8190
    fields = cfg.limit_request_fields or 100
    size = cfg.limit_request_field_size or 8190
    return min(line + 2 + fields * (size + 2) + 2, 1 << 20)
