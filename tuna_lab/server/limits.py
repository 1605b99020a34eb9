"""The lab server's bounds on what one request may cost, apart from the app so that reading them is cheap.

``tuna-lab serve``'s options print these defaults in their help; the CLI
reads them from here without importing the app (numpy, XGBoost).

Examples
--------
>>> READ_TIMEOUT
5.0
"""

from dataclasses import dataclass

__all__ = ["MAX_BODY_BYTES", "ROW_BUDGET_BYTES", "MAX_WORK", "READ_TIMEOUT", "RETRY_AFTER", "ServerLimits"]

#: Largest request body the server reads by default (``TUNA_LAB_MAX_BODY``); larger ones get 413.
MAX_BODY_BYTES = 50 * 1024 * 1024
#: Memory the rows of one request may take as float64 input, which sets the default row limit
#: (:func:`tuna_lab.server.app.max_rows`): a few huge requests must not push a worker into swap or the OOM killer.
ROW_BUDGET_BYTES = 50 * 1024 * 1024
#: Work one request may ask for by default (``TUNA_LAB_MAX_WORK``, ``tuna-lab serve --max-work``): its
#: rows x the model's cost (:func:`~tuna_lab.server.models.model_cost`). About 3 s of one CPU here
#: (65,104 rows of small, 22,321 of medium; large's 8,359 rows are bounded by memory first): a
#: 220,000-row request of small held a worker 14 s, most of it in SHAP, before this bound.
MAX_WORK = 250_000_000
#: Seconds a connection has, from the moment the server accepts it, to send its whole request (headers
#: and body), while it holds no worker; each response write has as long. Loopback clients send a 50 MB
#: body in well under it.
READ_TIMEOUT = 5.0
#: Seconds a client shed with 503 is told to wait (``Retry-After``) before it tries again.
RETRY_AFTER = 1


@dataclass(frozen=True)
class ServerLimits:
    """The bounds a :class:`~tuna_lab.server.launch.Server` is started with: ``Server(..., limits=...)``.

    Every field as ``Server`` took it (``tuna-lab serve``'s options); the server checks them.

    Parameters
    ----------
    max_requests : int
        Recycle each worker after this many requests (0: never).
    max_body_bytes : int, optional
        Largest request body read (default ``TUNA_LAB_MAX_BODY``, else :data:`MAX_BODY_BYTES`).
    max_work : int, optional
        The work bound of one request: its rows x the model's cost
        (:func:`~tuna_lab.server.models.model_cost`); a request over it gets
        413 before anything is predicted. Default ``TUNA_LAB_MAX_WORK``, else
        :data:`MAX_WORK` (about 3 s of one CPU).
    max_wait : float, optional
        The queue bound, in seconds: a ``/predict`` that waited longer for a
        worker gets 503 with ``Retry-After`` (load shedding). Default
        ``TUNA_LAB_MAX_WAIT``, else none: the experiment runner's load
        generator bounds what is in flight itself, and shedding would change
        what it measures.
    read_timeout : float
        Seconds a connection has, once a worker takes it, to send its whole
        request (and each answer to be written); a slow client is then
        dropped (408 when its body is missing), so it cannot hold a worker.
    request_timeout : float, optional
        The time bound of a request: Gunicorn's worker ``timeout``. A
        request (or a worker's warm-up) running longer is aborted and the
        worker replaced. Default ``TUNA_LAB_TIMEOUT``, else 120 s.
    time_limit : float
        Seconds the placement of a policy given by name may take to solve (a Tuna mapping), at start.

    Examples
    --------
    >>> ServerLimits(max_wait=0.5).read_timeout
    5.0
    """

    max_requests: int = 0
    max_body_bytes: int | None = None
    max_work: int | None = None
    max_wait: float | None = None
    read_timeout: float = READ_TIMEOUT
    request_timeout: float | None = None
    time_limit: float = 60
