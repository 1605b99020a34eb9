"""What Gunicorn imports: the WSGI app (``tuna_lab.server.wsgi:app``) and its worker class (:class:`LabWorker`).

Creating the app is cheap and loads no XGBoost: the master imports this
module before forking (for the worker class), and GNU libgomp's thread pool
does not survive fork.

Gunicorn's sync worker reads a request with a blocking socket and no time
limit, and serves every connection however long it waited for a worker.
:class:`LabWorker` is that worker with two bounds, set on the app
(:mod:`tuna_lab.server.app`):

* a **read deadline** per connection: the whole request (headers and body)
  must arrive within ``app.read_timeout`` seconds of the worker taking it.
  Without one, two half-sent requests held both workers of a server, and
  ``/healthz`` went unanswered for as long as they were held (until
  Gunicorn's worker ``timeout`` killed and replaced the worker);
* the **wait** of the connection: how long its request waited in the
  listening socket's queue for a worker (Linux's ``TCP_INFO``: the time since
  its last bytes arrived), which the app compares with its ``max_wait`` to
  shed the request with 503 and ``Retry-After``. A bound on the wait, not on
  the queue's length: clients that send again at once after a 503 keep a
  queue full, and a length bound would then shed every request, serving
  none; shed requests come back with no wait, and the workers keep serving
  at full speed, each request waiting at most ``max_wait``.
"""

import errno
import socket
import struct
import time

from gunicorn.http.errors import NoMoreData
from gunicorn.workers.sync import SyncWorker

from .app import READ_TIMEOUT, app_from_env

__all__ = ["app", "LabWorker", "ReadTimeout", "waited"]

app = app_from_env()

# struct tcp_info (linux/tcp.h): 8 one-byte fields, then 32-bit ones; the 12th of those,
# tcpi_last_data_recv, is the milliseconds since the connection last received data.
_TCP_INFO = struct.Struct("8B24I")
_LAST_DATA_RECV = 8 + 11


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


class _Connection(socket.socket):
    """An accepted connection whose reads all end by one deadline, and whose writes each get ``read_timeout``.

    A timeout per ``recv`` would not do: a client trickling one byte a
    second would hold the worker for as long as Gunicorn's header limits
    let it (hundreds of kilobytes).
    """

    def __init__(self, client, read_timeout, waited):
        super().__init__(client.family, client.type, client.proto, fileno=client.detach())
        self.read_timeout, self.waited = read_timeout, waited
        self.deadline = time.monotonic() + read_timeout
        self.timed_out = self.answered = False

    def recv(self, bufsize, flags=0):
        if self.answered:
            # Gunicorn draining the connection before it closes it, with a bound of its own.
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
        # A fresh bound: the last read may have left only milliseconds, and a
        # client that never reads its answer must not hold the worker either.
        self.settimeout(self.read_timeout)
        self.answered = True
        return super().sendall(data, flags)


def waited(conn):
    """Seconds since the accepted connection ``conn`` last received data (Linux ``TCP_INFO``); None elsewhere.

    Taken before its request is read, it is how long the request - sent
    whole when the client connected - waited in the queue for a worker (to
    the kernel's tick: 1-10 ms).

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


class LabWorker(SyncWorker):
    """Gunicorn's sync worker with a read deadline per connection, and each request's wait told to the app.

    Gunicorn loads it by name (``worker_class``); the bounds are the app's
    (``read_timeout``, ``max_wait``), so the app's environment variables set them.
    """

    def handle(self, listener, client, addr):
        conn = _Connection(client, getattr(self.wsgi, "read_timeout", READ_TIMEOUT), waited(client))
        super().handle(listener, conn, addr)
        if conn.timed_out:
            self.log.warning("closed the connection of %s: %s", addr[0] if addr else "?",
                             ReadTimeout(conn.read_timeout))
