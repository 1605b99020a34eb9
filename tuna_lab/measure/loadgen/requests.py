"""What every request of a trial is: method, path (or a whole URL), headers and bodies, from the options.

:class:`Requests` is what a target (:mod:`tuna_lab.measure.target`) sends:
the lab server's payload, or a user's own requests as ``run --app`` and
``run --pid`` read them from ``--path``, ``--method``, ``--header``,
``--body`` and ``--bodies``. :meth:`Requests.from_options` is the one
reading of those options: ``pin``, ``status``, ``run`` and ``tune`` send the
same method, body, ``Content-Type`` and headers, all through the load generator
(:meth:`Requests.load_options`, a :class:`Send`), and a refused request says what was sent
(:func:`describe_sent`).

Examples
--------
>>> r = Requests(path="/score", method="PUT", headers=(("X-Key", "1"),), bodies=(b"{}", b"[]"))
>>> r.describe()["bodies"], r.load_options()["send"].method
(2, 'PUT')
"""

import hashlib
import re
from dataclasses import dataclass

from ..._files import loads_json
from ...errors import TargetError

__all__ = ["Requests", "Send", "read_option_file", "describe_sent", "body_content_type"]

# The request methods a user may name (RFC 7231's token, upper case by convention).
_METHOD = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


@dataclass(frozen=True)
class Send:
    """How a load loop sends every request and reads every answer: the ``send=`` of the loops.

    What :func:`~tuna_lab.measure.loadgen.load.closed_loop` and
    :func:`~tuna_lab.measure.loadgen.load.open_loop` send beside the URL and
    the body; :meth:`Requests.load_options` makes one from a :class:`Requests`.
    The loops check it (a one-line ``LoadError``) before any socket is opened.

    Parameters
    ----------
    method : str
        Any HTTP method (a token), sent as given.
    headers : dict or sequence of (str, str), optional
        More headers, in order; ``Content-Type`` or ``User-Agent`` here replaces the default.
    content_type : str or None
        The ``Content-Type`` of a request with a body (None: none).
    response : {"lab", "any"}
        ``"lab"``: a 2xx body is the lab server's JSON; ``"any"``: a user's
        app, whose bodies are not read.
    server_timing : str, optional
        The ``Server-Timing`` metric whose ``dur`` is ``server_seconds`` when
        the body gives none (default: the first metric with a ``dur``).

    Examples
    --------
    >>> Send(method="GET", response="any")
    Send(method='GET', headers=None, content_type='application/json', response='any', server_timing=None)
    """

    method: str = "POST"
    headers: object = None
    content_type: str | None = "application/json"
    response: str = "lab"
    server_timing: str | None = None


@dataclass(frozen=True)
class Requests:
    """What every request of a trial is: method, path (or a full URL), headers and bodies (cycled).

    Parameters
    ----------
    path : str
        ``/p`` on the server tuna_lab started, or a whole loopback URL.
    method : str
    headers : tuple of (str, str)
    bodies : tuple of bytes
        Request ``i`` sends ``bodies[i % len(bodies)]``; empty for no body.
    content_type : str or None
        Sent with every request that has a body (None: no ``Content-Type``).
    server_timing : str, optional
        The ``Server-Timing`` metric taken as the server-side runtime
        (default: the first metric with a duration).
    response : {"lab", "any"}
        ``"lab"``: the lab server's JSON body, with its own timings; ``"any"``:
        a user's response, not parsed.
    """

    path: str = "/predict"
    method: str = "POST"
    headers: tuple = ()
    bodies: tuple = ()
    content_type: str = "application/json"
    server_timing: str | None = None
    response: str = "any"

    def __post_init__(self):
        if not _METHOD.match(self.method or ""):
            raise TargetError(f"--method {self.method!r} is not an HTTP method")
        object.__setattr__(self, "method", self.method.upper())
        object.__setattr__(self, "headers", tuple((str(k), str(v)) for k, v in self.headers))
        object.__setattr__(self, "bodies", tuple(bytes(b) for b in self.bodies))

    @classmethod
    def from_options(cls, path="/predict", method=None, headers=(), body=None, bodies=None, server_timing=None):
        """Requests from the command line's options: ``--header K:V``, ``--body FILE``, ``--bodies FILE.jsonl``.

        ``--body`` is sent as is (``-``: read from stdin); ``--bodies`` is a JSON Lines file whose every
        non-empty line is one body, sent in turn. Without either, a ``GET``
        with no body (or the ``method`` given). The ``Content-Type`` is a
        ``--header Content-Type:...`` if there is one, else
        :func:`body_content_type` of the bodies (``application/json`` for
        JSON), else none (no body).

        Raises
        ------
        TargetError
            A header without ``:``, a missing or unreadable file, an empty
            file, a line of ``--bodies`` that is not JSON, or both files.

        Examples
        --------
        >>> Requests.from_options("/p", headers=["X-Key: 1"]).headers, Requests.from_options("/p").method
        ((('X-Key', '1'),), 'GET')
        >>> Requests.from_options("/p").content_type is None
        True
        """
        parsed = []
        for h in headers or ():
            name, sep, value = str(h).partition(":")
            if not sep or not name.strip():
                raise TargetError(f"--header {h!r} is not NAME:VALUE")
            parsed.append((name.strip(), value.strip()))
        if body is not None and bodies is not None:
            raise TargetError("give --body or --bodies, not both")
        data = ()
        if body == "-":
            data = (_read_stdin(),)
        elif body is not None:
            data = (read_option_file(body, "--body"),)
        elif bodies is not None:
            data = _read_jsonl(bodies)
        method = method or ("POST" if data else "GET")
        content_type = next((v for k, v in parsed if k.lower() == "content-type"), None) or \
            (body_content_type(data) if data else None)
        return cls(path=path, method=method, headers=tuple(parsed), bodies=data, content_type=content_type,
                   server_timing=server_timing)

    def url_on(self, base):
        """The URL requests go to: ``path`` on ``base`` (``http://127.0.0.1:PORT``), or ``path`` if it is one."""
        return self.path if "://" in self.path else base.rstrip("/") + "/" + self.path.lstrip("/")

    def load_options(self):
        """The keyword arguments of :func:`~tuna_lab.measure.loadgen.load.closed_loop` that send these requests.

        Returns
        -------
        dict
            ``{"send": Send(...)}``: the method, headers, ``Content-Type``, response and Server-Timing metric.
        """
        headers = tuple((k, v) for k, v in self.headers if k.lower() != "content-type")
        return {"send": Send(method=self.method, headers=headers, content_type=self._content_type(),
                             response=self.response, server_timing=self.server_timing)}

    def _content_type(self):
        """The ``Content-Type`` sent with a body: a header named so, else :attr:`content_type`."""
        return next((v for k, v in self.headers if k.lower() == "content-type"), self.content_type)

    def send_headers(self):
        """Every header a request with a body carries, ``Content-Type`` included: for a client of its own.

        What another client (urllib, httpx) sends to make the requests tuna_lab's generator
        sends (``pin --url`` and ``status --url`` send through the generator itself).

        Examples
        --------
        >>> Requests.from_options("/p", headers=["X-Key: 1"], body=None).send_headers()
        [('X-Key', '1')]
        >>> Requests(path="/p", bodies=(b"{}",)).send_headers()
        [('Content-Type', 'application/json')]
        """
        headers = list(self.load_options()["send"].headers)
        if self._content_type() and (self.bodies or self.method not in ("GET", "HEAD")):
            headers.insert(0, ("Content-Type", self._content_type()))
        return headers

    def sent(self, index=0):
        """What request ``index`` sends, for an error message: :func:`describe_sent` of its body.

        Examples
        --------
        >>> Requests(path="/p", bodies=(b"{}",)).sent()
        'POST, Content-Type application/json, a 2-byte body'
        """
        body = self.bodies[index % len(self.bodies)] if self.bodies else b""
        return describe_sent(self.method, self._content_type() if body or self.method not in ("GET", "HEAD")
                             else None, body)

    def body(self):
        """The body argument of the load functions: one body, or the list cycled."""
        if not self.bodies:
            return b""
        return self.bodies[0] if len(self.bodies) == 1 else list(self.bodies)

    def describe(self):
        """What the manifest records: method, path, header names (not values), bodies and their digest."""
        digest = hashlib.sha256(b"\0".join(self.bodies)).hexdigest()[:16] if self.bodies else None
        return {"method": self.method, "path": self.path, "headers": [k for k, _ in self.headers],
                "bodies": len(self.bodies), "bodies_sha256": digest, "server_timing": self.server_timing,
                "response": self.response}


def body_content_type(bodies):
    """The ``Content-Type`` of ``bodies`` sent without one named: ``application/json`` if each is JSON.

    Anything else goes as ``application/octet-stream``: bytes the server is
    to read as they are, never a form (urllib's default for a body).

    Examples
    --------
    >>> body_content_type([b'{"rows": [[1, 2]]}']), body_content_type([b"a=1"])
    ('application/json', 'application/octet-stream')
    """
    from ...errors import UnsafeFileError

    try:
        for body in bodies:
            loads_json(body)
    except UnsafeFileError:
        return "application/octet-stream"
    return "application/json"


def describe_sent(method, content_type, body):
    """One phrase saying what a request sent: what a 4xx answer is reported with.

    Examples
    --------
    >>> describe_sent("POST", "application/json", b"{}")
    'POST, Content-Type application/json, a 2-byte body'
    >>> describe_sent("GET", None, b"")
    'GET, no Content-Type, no body'
    """
    size = len(body or b"")
    return (f"{method}, " + (f"Content-Type {content_type}" if content_type else "no Content-Type") + ", "
            + (f"a {size}-byte body" if size else "no body"))


def read_option_file(path, option):
    """The bytes of the file an option names (``--body``, ``--server-conf``...); one-line TargetError if unreadable.

    Examples
    --------
    >>> read_option_file("/proc/nonexistent", "--body")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.TargetError: --body /proc/nonexistent: No such file or directory
    """
    from ..._files import read_bytes

    try:
        # A regular file only (a FIFO would hold the run until someone writes to it), within the size cap.
        return read_bytes(path, error=TargetError)
    except FileNotFoundError as exc:
        raise TargetError(f"{option} {path}: {exc.strerror}") from None
    except TargetError as exc:
        raise TargetError(f"{option} {exc}") from None


def _read_stdin():
    """``--body -``: the body from stdin, within the size cap of any file read."""
    import sys

    from ..._files import MAX_FILE_BYTES

    data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise TargetError(f"--body -: stdin holds more than {MAX_FILE_BYTES} bytes")
    return data


def _read_jsonl(path):
    out = []
    for number, line in enumerate(read_option_file(path, "--bodies").splitlines(), 1):
        if not line.strip():
            continue
        # One line for a line that is not JSON, or that nests too deeply to parse.
        loads_json(line, where=f"--bodies {path}: line {number}", error=TargetError)
        out.append(line.strip())
    if not out:
        raise TargetError(f"--bodies {path}: no body in it (one JSON document per line)")
    return tuple(out)
