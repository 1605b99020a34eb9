"""A trivial HTTP endpoint in a process of its own: what a load trial against it measures is the generator.

:func:`tuna_lab.measure.loadgen.load.measure_generator` and the load benchmark
(:mod:`tuna_lab.bench.load`) drive it; its answer has the inference
server's fields, all 0.

Examples
--------
>>> # skipped: starts a process that serves HTTP (tests/test_load_bench.py does)
>>> with trivial_endpoint() as url:   # doctest: +SKIP
...     url.startswith("http://127.0.0.1:")
True
"""

import contextlib
import socket
import subprocess
import sys

__all__ = ["trivial_endpoint", "serve_trivial"]

# Response body of the trivial endpoint: what the inference server answers, minus the work.
_TRIVIAL_BODY = (b'{"count": 1, "stages": {"deserialize": 0.0, "convert": 0.0, "dmatrix": 0.0, "predict": 0.0, '
                 b'"shap": 0.0}, "server_seconds": 0.0, "pid": -1}')


def serve_trivial(sock, keep_alive=True):
    """Answer every HTTP/1.1 request on listening socket ``sock`` at once, until stdin closes.

    The body of each answer is fixed (the inference server's fields, all 0).
    Connections are kept alive, or closed after each answer as Gunicorn's
    sync workers do (``keep_alive=False``). The main of
    :func:`trivial_endpoint`'s process.

    Examples
    --------
    >>> # skipped: needs a listening socket; it serves until killed
    >>> serve_trivial(listening_socket)   # doctest: +SKIP
    """
    import asyncio

    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
              % (len(_TRIVIAL_BODY), b"" if keep_alive else b"Connection: close\r\n")) + _TRIVIAL_BODY

    class Answer(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buf = transport, b""

        def data_received(self, data):
            self.buf += data
            while True:
                head_end = self.buf.find(b"\r\n\r\n")
                if head_end < 0:
                    return
                length = 0
                for line in self.buf[:head_end].split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                end = head_end + 4 + length
                if len(self.buf) < end:
                    return
                self.buf = self.buf[end:]
                self.transport.write(answer)
                if not keep_alive:
                    self.transport.close()
                    return

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Answer, sock=sock)
        # stdin closes when the parent goes away (or stops us): then stop.
        done = loop.create_future()
        loop.add_reader(sys.stdin.fileno(), lambda: done.done() or done.set_result(None))
        async with server:
            await done

    asyncio.run(main())


@contextlib.contextmanager
def trivial_endpoint(keep_alive=True):
    """A server on 127.0.0.1 that answers every ``POST`` at once, in its own process; yields its URL.

    Being another process, it takes nothing from the generator's thread (no
    shared GIL or event loop), so what a trial against it measures is the
    generator. With ``keep_alive=False`` it closes every connection after
    its answer, as Gunicorn's sync workers do. The process is stopped when
    the block ends.

    Examples
    --------
    >>> # skipped: starts a process that serves HTTP (tests/test_load_bench.py does)
    >>> from tuna_lab.measure.loadgen.load import closed_loop
    >>> with trivial_endpoint() as url:   # doctest: +SKIP
    ...     closed_loop(url, b"{}", requests=100)
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        port = listener.getsockname()[1]
        code = ("import socket, sys; from tuna_lab.measure.loadgen.trivial import serve_trivial; "
                "serve_trivial(socket.socket(fileno=int(sys.argv[1])), sys.argv[2] == '1')")
        proc = subprocess.Popen([sys.executable, "-c", code, str(listener.fileno()), "1" if keep_alive else "0"],
                                stdin=subprocess.PIPE,
                                pass_fds=(listener.fileno(),))
    finally:
        listener.close()
    try:
        yield f"http://127.0.0.1:{port}/predict"
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
