"""A few requests at a time, for a caller that watches what the server does meanwhile: :func:`round_sender`.

``pin --url`` and ``status --url`` send a few rounds of requests, as many at
once as the server has workers, and read every worker thread's CPU time
between rounds (:func:`tuna_lab.live.traffic.serve_requests`). Each round goes
through the load generator's own closed loop
(:func:`~tuna_lab.measure.loadgen.load.closed_loop`): the same wire, the same
requests as ``run`` sends (:class:`~tuna_lab.measure.loadgen.requests.Requests`),
and one connection per request, so that the kernel hands them to every
worker of a server that shares one listening socket. Unlike a measured
trial, a round that fails is an error: the requests were to run the model.

Examples
--------
>>> from tuna_lab.measure.loadgen.requests import Requests
>>> round_sender(Requests(path="http://example.com/"))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tuna_lab.errors.LoadError: --url must be an http:// URL on this machine's loopback ...
"""

from ..._checks import one_line, positive_number
from ...errors import LoadError

__all__ = ["round_sender"]


def round_sender(requests, timeout=10.0, error=LoadError):
    """A function ``send(n)`` that sends ``n`` of ``requests`` at once and returns when each is answered.

    Parameters
    ----------
    requests : Requests
        What is sent; its ``path`` is the whole loopback URL.
    timeout : float
        Seconds each request may take.
    error : type
        The exception for a URL that is not loopback and for a round that
        fails (the caller's: ``pin`` says :class:`~tuna_lab.errors.PinError`).

    Returns
    -------
    callable
        ``send(n)``: one round of ``n`` requests. Raises ``error`` in one
        line on the first that fails: what it sent and what came back (an
        HTTP status is most often a content type the server does not take),
        or why it could not be sent.

    Raises
    ------
    error
        ``requests.path`` is not an ``http://`` URL on a loopback address.
    """
    from .wire import check_url

    url = requests.path
    try:
        check_url(url)
    except LoadError:
        raise error(f"--url must be an http:// URL on this machine's loopback (127.0.0.1, localhost, ::1), "
                    f"got {url!r}") from None
    timeout = positive_number("timeout", timeout, error)
    options = requests.load_options()

    def send(n):
        from http import HTTPStatus

        from .load import closed_loop

        try:
            frame = closed_loop(url, requests.body(), requests=n, concurrency=n, timeout=timeout, reuse=1, **options)
        except LoadError as exc:
            raise error(f"cannot send {requests.method} {url}: {one_line(exc)}") from None
        statuses = frame["status"].tolist()
        failed = [i for i, status in enumerate(statuses) if not 200 <= status < 300]
        if not failed:
            return
        i = failed[0]
        status, why = int(statuses[i]), str(frame["error"].iloc[i])
        if status < 0:
            raise error(f"cannot send {requests.method} {url}: {_reason(url, why) or 'no answer'}")
        try:
            phrase = f" {HTTPStatus(status).phrase}"
        except ValueError:
            phrase = ""
        raise error(f"{requests.method} {url} answered {status}{phrase} to {requests.sent(i)}: give the URL (and "
                    "--method, --header, --body) of a request that runs the model")

    return send


def _reason(url, why):
    """The wire's reason for a request that got no answer; for a failed connection, the OS's own.

    The wire connects without waiting and sends at once, so a refused
    connection reads as the send's error there (``Broken pipe``): one
    blocking connection says what the user can act on (``Connection refused``).
    """
    import socket

    from .wire import resolve

    if not why.startswith("connect:"):
        return why
    family, address = resolve(url)
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            sock.connect(address)
    except OSError as exc:
        return exc.strerror or str(exc)
    return why
