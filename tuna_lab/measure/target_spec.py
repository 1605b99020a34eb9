"""What a measurement is pointed at, as plain data (:class:`TargetSpec`), and the one builder of its target.

The CLI only parses: ``run``, ``sweep`` and ``tune`` turn their "your own
server" options into a :class:`TargetSpec` and hand it to :func:`build_target`,
which reads the files the options name, the server's processes and its pin
records (:mod:`tuna_lab.measure.attached`), and returns the checked target of
:mod:`tuna_lab.measure.target`. A program builds the same spec by hand.

Examples
--------
>>> TargetSpec().kind, TargetSpec(app="myapp:app").kind, TargetSpec(pid=1234, url="http://127.0.0.1:8000/").kind
('lab', 'app', 'attached')
>>> build_target(TargetSpec()) is None
True
"""

from dataclasses import dataclass

from ..errors import TargetError

__all__ = ["TargetSpec", "build_target"]


@dataclass(frozen=True)
class TargetSpec:
    """The lab server (no ``app``, no ``pid``), a user's app tuna_lab starts (``app``) or a running server (``pid``).

    Every field is one option of ``run``/``sweep``/``tune``, as given; files
    (``body``, ``bodies``, ``server_conf``) are read by :func:`build_target`.

    Parameters
    ----------
    app : str, optional
        ``MODULE:APP`` (``--app``), started under ``server`` from ``app_dir``
        with ``server_conf`` in ``python``.
    pid : int, optional
        A running server's master (``--pid``), answering at ``url``, with
        ``threads`` pool threads per worker; ``force`` and ``front_cpus`` as
        :class:`~tuna_lab.measure.attached.AttachedTarget` takes them.
    path, method, headers, body, bodies, server_timing
        The requests (:meth:`Requests.from_options
        <tuna_lab.measure.loadgen.requests.Requests.from_options>`): ``path``
        on the app, ``url`` for a running server; ``headers`` as ``"K: V"``;
        ``body``/``bodies`` file names (``-``: stdin).
    label : str, optional
        The target's name in the results.

    Raises
    ------
    TargetError
        Both ``app`` and ``pid``.
    """

    app: str | None = None
    pid: int | None = None
    url: str | None = None
    threads: int | None = None
    path: str = "/"
    method: str | None = None
    headers: tuple = ()
    body: str | None = None
    bodies: str | None = None
    server_timing: str | None = None
    label: str | None = None
    server: str = "gunicorn"
    app_dir: str | None = None
    server_conf: str | None = None
    python: str | None = None
    force: bool = False
    front_cpus: tuple | None = None

    def __post_init__(self):
        if self.app is not None and self.pid is not None:
            raise TargetError("give --app (a server tuna_lab starts) or --pid (one already running), not both")
        object.__setattr__(self, "headers", tuple(self.headers or ()))
        if self.front_cpus is not None:
            object.__setattr__(self, "front_cpus", tuple(sorted({int(c) for c in self.front_cpus})))

    @property
    def kind(self):
        """``"lab"``, ``"app"`` or ``"attached"``: :attr:`Target.kind <tuna_lab.measure.target.Target.kind>`."""
        return "app" if self.app is not None else "attached" if self.pid is not None else "lab"

    def requests(self):
        """The :class:`~tuna_lab.measure.loadgen.requests.Requests` the options describe (its files read)."""
        from .loadgen.requests import Requests

        where = self.url if self.kind == "attached" else self.path
        return Requests.from_options(where, self.method, self.headers, self.body, self.bodies, self.server_timing)


def build_target(spec):
    """The checked target ``spec`` names: None (the lab server), a running server's, or ``(W, T) -> AppTarget``.

    For ``pid`` the :class:`~tuna_lab.measure.attached.AttachedTarget`,
    checked (:meth:`~tuna_lab.measure.attached.AttachedTarget.check`: a
    server's master, not pinned by ``pin --pid``, front CPUs of its own, a
    URL it listens on); it keeps its workers. For ``app`` a function of W and
    T, since a sweep or a tune starts the app at several sizes: the app, its
    folder and config are checked now, and the app imported in its
    interpreter, before anything runs.

    Raises
    ------
    TargetError
        The first thing wrong, in one line; nothing has been changed.
    """
    if spec.kind == "lab":
        return None
    requests = spec.requests()
    if spec.kind == "attached":
        from .attached import AttachedTarget

        if spec.url is None or spec.threads is None:
            raise TargetError("--pid needs --url (where the running server answers) and -t (its pool threads per "
                              "worker)")
        return AttachedTarget(spec.pid, spec.url, spec.threads, requests, label=spec.label, force=spec.force,
                              front_cpus=spec.front_cpus).check()
    from .target import AppTarget

    def target(workers, threads):
        return AppTarget(spec.app, workers, threads, server=spec.server, app_dir=spec.app_dir,
                         server_conf=spec.server_conf, requests=requests, label=spec.label, python=spec.python)

    target(1, 1).check()
    return target
