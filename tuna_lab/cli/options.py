"""Options, argument parsers and output helpers that several ``tuna-lab`` commands share.

Only the standard library is imported here at module level: building the
parser must stay cheap, so that ``tuna-lab topology`` does not pay for the
solver or the analysis (what an option needs is imported when it is used).

Examples
--------
>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_topology_options(parser)
>>> topology_of(parser.parse_args(["--synthetic", "core:2 pu:2"])).n_logical
4
"""

import argparse
import json
import math
import sys
import warnings

from ..errors import ThrottlingWarning, TopologyWarning, TunaError

__all__ = ["add_topology_options", "topology_of", "add_size_options", "positive_float_arg", "non_negative_int_arg",
           "add_wait_options", "add_strict_option", "check_cpu_quota", "configs_arg", "policies_arg",
           "policy_choices", "policies_help", "add_client_cpus_option", "client_cpus_of",
           "add_strict_families_option", "check_measure_options", "target_of", "target_spec_of", "no_valid_status",
           "SIZE_BOUND_HELP", "TOPOLOGY_BOUND_HELP", "add_front_cpus_option", "front_cpus_of", "add_worker_options",
           "worker_choice_of", "add_traffic_options", "traffic_of", "plan_for", "add_target_options", "MEASURE_HELP",
           "no_valid_status_of", "progress", "print_json", "THREADS_HELP", "WAIT_DEFAULT", "SPINCOUNT_HELP",
           "TIME_LIMIT_HELP", "check_duration", "add_renamed", "worker_count_arg", "add_request_options",
           "requests_of"]

# The options of the commands that act on a running server live beside these (cli/server_options.py);
# every command finds them here, loaded on first use: `tuna-lab topology` imports no more than it did.
_SERVER_OPTIONS = ("add_front_cpus_option", "front_cpus_of", "add_worker_options", "worker_choice_of",
                   "add_traffic_options", "traffic_of", "add_renamed", "worker_count_arg", "add_request_options",
                   "requests_of")


def __getattr__(name):
    if name in _SERVER_OPTIONS:
        from . import server_options

        return getattr(server_options, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: What the help says of the bounds in :mod:`tuna_lab._checks`, in words (tests/test_cli_inputs.py checks
#: that they agree).
SIZE_BOUND_HELP = "W x T at most 8192"
TOPOLOGY_BOUND_HELP = "at most 4096 logical CPUs, ids up to 65535"

#: ``-t/--threads``, said one way: T counts every thread of a worker's team, its main thread included.
THREADS_HELP = "threads per worker: its main thread and a pool of T-1"
#: The OpenMP runtime's own wait, which ``--wait-policy default`` and ``--spincount`` unset leave.
WAIT_DEFAULT = "(default: the runtime's own, spin then sleep)"
SPINCOUNT_HELP = "GOMP_SPINCOUNT, spins before an idle thread sleeps (default: the runtime's)"
#: ``--time-limit`` of the commands that may solve (solve, plan).
TIME_LIMIT_HELP = "the solver's time limit in seconds, for the tuna-* policies (default: no limit)"

#: Help of the options that several measuring commands (``run``, ``sweep``, ``demo``) share.
MEASURE_HELP = {
    "model": "the model: small, medium or large",
    "batch": "rows per request",
    "trials": "trials; in each, every policy runs once, in a random order, on a fresh server",
    "requests": "requests per policy and trial",
    "seed": "seed of the policy order and the payloads",
    "errors": "a trial with a larger share of failed requests (non-2xx, timeouts) is marked failed",
}


def add_topology_options(parser):
    """Add ``--preset``, ``--hwloc-xml``, ``--synthetic`` and ``--fsroot`` (at most one of them) to ``parser``.

    :func:`topology_of` reads the machine they name; none of them means this machine.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_topology_options(parser)
    >>> parser.parse_args(["--preset", "epyc-7313p"]).preset
    'epyc-7313p'
    """
    g = parser.add_argument_group(
        "the machine (docs/cli.md)", f"One of these, else this machine (the CPUs this process may use); "
                                     f"{TOPOLOGY_BOUND_HELP}.")
    g = g.add_mutually_exclusive_group()
    g.add_argument("--preset", metavar="NAME",
                   # written out rather than read from machine.synthetic.PRESETS, which imports numpy;
                   # tests/test_cli.py checks that the two agree
                   help="a preset: xeon-8272cl, xeon-8260-2s, epyc-7313p, epyc-9654, epyc-9654-2s, epyc-9965-2s")
    g.add_argument("--hwloc-xml", metavar="FILE", help="the XML `lstopo --of xml` writes")
    g.add_argument("--synthetic", metavar="SPEC", help='an hwloc synthetic spec, e.g. "pack:2 core:4 pu:2"')
    g.add_argument("--fsroot", metavar="DIR", help="a Linux root copied from a machine (DIR/sys, DIR/proc)")


def add_size_options(parser, required=True, pids=False):
    """Add ``-w/--workers`` and ``-t/--threads``, the size of a server, to ``parser``.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_size_options(parser)
    >>> args = parser.parse_args(["-w", "4", "-t", "2"])
    >>> args.workers, args.threads
    (4, 2)
    """
    from .server_options import worker_count_arg

    # Where the command also takes --worker-pids (plan), a list of PIDs given to -w gets the pointer to it.
    parser.add_argument("-w", "--workers", type=worker_count_arg if pids else int, required=required, metavar="W",
                        help=f"worker processes, a count ({SIZE_BOUND_HELP})")
    parser.add_argument("-t", "--threads", type=int, required=required, metavar="T", help=THREADS_HELP)


def topology_of(args):
    """The :class:`~tuna_lab.Topology` that the options of :func:`add_topology_options` name.

    The one place where the CLI turns those options into a machine. Each option
    names its reader, so the text is read only as what the user said it is:
    ``--hwloc-xml`` is always a file (a missing one says so), ``--synthetic`` is
    always a synthetic spec (a typo is a parse error, not taken for a preset),
    ``--preset`` lists the presets when the name is unknown, and ``--fsroot``
    reads a filesystem root (:meth:`~tuna_lab.Topology.from_fsroot`). With no
    option, :func:`tuna_lab.machine.topology_from` reads this machine, as
    everywhere else.

    A :class:`~tuna_lab.errors.TopologyWarning` (a machine read without any
    cache information) is printed as one line on stderr.

    Raises
    ------
    TopologyError
        The preset, file or spec could not be read.

    Examples
    --------
    >>> from argparse import Namespace
    >>> topology_of(Namespace(preset="xeon-8272cl", hwloc_xml=None, synthetic=None, fsroot=None)).n_logical
    32
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TopologyWarning)
        topo = _read_topology(args)
    for w in caught:
        if issubclass(w.category, TopologyWarning):
            print(f"tuna-lab: warning: {w.message}", file=sys.stderr)
        else:  # not ours to reformat: shown as Python would have shown it
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return topo


def _read_topology(args):
    """The machine the topology options name (the readers, without the warnings' formatting)."""
    from ..machine import Topology, topology_from

    if args.preset:
        return Topology.preset(args.preset)
    if args.hwloc_xml:
        return Topology.from_hwloc_xml(args.hwloc_xml)
    if args.synthetic:
        return Topology.synthetic(args.synthetic)
    if args.fsroot:
        return Topology.from_fsroot(args.fsroot)
    return topology_from(None)


def positive_float_arg(text):
    """An argparse ``type``: ``text`` as a float > 0.

    Examples
    --------
    >>> positive_float_arg("2.5")
    2.5
    >>> positive_float_arg("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be positive: '0'
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def non_negative_int_arg(text):
    """An argparse ``type``: ``text`` as an int >= 0.

    Examples
    --------
    >>> non_negative_int_arg("0")
    0
    >>> non_negative_int_arg("-1")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: expected a non-negative integer, got '-1'
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def add_wait_options(parser):
    """Add the workers' OpenMP wait options ``--wait-policy`` and ``--spincount`` to ``parser``.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_wait_options(parser)
    >>> args = parser.parse_args(["--wait-policy", "passive"])
    >>> args.wait_policy, args.spincount
    ('passive', None)
    """
    from ..server.openmp import WAIT_POLICIES

    parser.add_argument("--wait-policy", choices=WAIT_POLICIES, default="default", metavar="POLICY",
                        help=f"OMP_WAIT_POLICY of the workers: {', '.join(WAIT_POLICIES)} {WAIT_DEFAULT}")
    parser.add_argument("--spincount", type=non_negative_int_arg, default=None, metavar="N", help=SPINCOUNT_HELP)


def add_strict_option(parser):
    """Add ``--strict``: refuse to measure when the CPU quota is below the CPUs the threads will use.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_strict_option(parser)
    >>> parser.parse_args(["--strict"]).strict
    True
    """
    parser.add_argument("--strict", action="store_true",
                        help="refuse (exit 2), not warn, when the CPU quota is below the CPUs the threads run on")


def add_client_cpus_option(parser):
    """Add ``--client-cpus CPULIST``: CPUs for the load generator, kept free of the server's placement.

    :func:`client_cpus_of` turns it into the split (``run``, ``sweep`` and ``serve`` share it).

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_client_cpus_option(parser)
    >>> parser.parse_args(["--client-cpus", "6-7"]).client_cpus, parser.parse_args([]).client_cpus
    ('6-7', None)
    """
    parser.add_argument("--client-cpus", metavar="CPULIST", default=None,
                        help="CPUs kept for the load generator, e.g. 6-7 or none (default: none below 8 CPUs, "
                             "else one core)")


def client_cpus_of(args, error=TunaError, threads=(), topology=None):
    """The :class:`~tuna_lab.machine.reserve.ClientCpus` that ``--client-cpus`` asks for, checked.

    Nothing is printed: the command says :meth:`~tuna_lab.machine.reserve.ClientCpus.describe`
    once the rest of its input is checked too, so that bad input stays one line.

    Parameters
    ----------
    args : argparse.Namespace
        With ``client_cpus`` (:func:`add_client_cpus_option`).
    error : type
        The exception for bad input (the calling command's: ExperimentError, ServerError).
    threads : iterable of int, or callable
        Threads per worker of each server to run: each must fit on the CPUs
        left. A callable is given the split and returns them (a grid sized by
        the server's CPUs).
    topology : Topology, optional
        Default: this machine and the CPUs this process may use.

    Raises
    ------
    error
        A malformed list, CPUs this process may not use, no CPU left for the
        server, or fewer left than a server's threads per worker.

    Examples
    --------
    >>> from argparse import Namespace
    >>> from tuna_lab.machine import Topology
    >>> client_cpus_of(Namespace(client_cpus="1"), topology=Topology.synthetic("core:2 pu:1")).server.cpus
    (0,)
    """
    from ..machine.reserve import reserve_client_cpus

    split = reserve_client_cpus(args.client_cpus, topology, error=error)
    for t in threads(split) if callable(threads) else threads:
        split.check_threads(t, error)
    return split


def check_cpu_quota(threads, strict=False, error=TunaError, limits=None):
    """Warn in one stderr line - or, ``strict``, raise ``error`` - when the CPU quota cannot run ``threads`` at once.

    The rule is the library's (:func:`~tuna_lab.machine.limits.check_throttling`);
    its :class:`~tuna_lab.errors.ThrottlingWarning` becomes one
    ``tuna-lab: warning:`` line, said once per command.

    Parameters
    ----------
    threads : int
        Threads that may run at once (workers x threads per worker).
    strict : bool
        Raise instead of warning.
    error : type
        The exception to raise (the calling command's: ExperimentError, ServerError).
    limits : Limits, optional
        Default: this process's (:meth:`Limits.read <tuna_lab.machine.limits.Limits.read>`).

    Returns
    -------
    Limits

    Examples
    --------
    >>> from tuna_lab.machine import Limits
    >>> # skipped: the line goes to stderr, which doctest does not compare
    >>> _ = check_cpu_quota(4, limits=Limits(online=(0, 1, 2, 3), quota=1.5))  # doctest: +SKIP
    tuna-lab: warning: CPU quota 1.5 CPUs is below the 4 CPUs these threads run on: ...
    >>> check_cpu_quota(4, strict=True, limits=Limits(online=(0, 1, 2, 3), quota=1.5))
    Traceback (most recent call last):
    tuna_lab.errors.TunaError: CPU quota 1.5 CPUs is below the 4 CPUs these threads run on: ...
    """
    from ..machine.limits import check_throttling

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ThrottlingWarning)
        limits = check_throttling(threads, strict=strict, error=error, limits=limits)
    for w in caught:
        if issubclass(w.category, ThrottlingWarning):
            print(f"tuna-lab: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    # Said once, here: the run and each server it starts check again (the command's main restores the filters).
    warnings.filterwarnings("ignore", category=ThrottlingWarning)
    return limits


def configs_arg(text):
    """``"2x2,4x1"`` (``--configs``) as ``[(workers, threads), ...]``.

    Raises
    ------
    TunaError
        An item is not two positive integers joined by ``x``.

    Examples
    --------
    >>> configs_arg("1x2, 4X1")
    [(1, 2), (4, 1)]
    """
    from .._checks import check_size

    pairs = []
    for item in text.split(","):
        w, sep, t = item.strip().lower().partition("x")
        # isascii: str.isdecimal accepts other scripts' digits, which are no worker count; at most 9 digits,
        # so that int() never meets a number of thousands of digits (check_size bounds the rest).
        if not (sep and w.isdecimal() and t.isdecimal() and w.isascii() and t.isascii()
                and len(w) <= 9 and len(t) <= 9 and int(w) > 0 and int(t) > 0):
            raise TunaError(f"--configs wants WxT pairs like 2x2,4x1 ({SIZE_BOUND_HELP}), got {item.strip()!r}")
        pairs.append(check_size(int(w), int(t)))
    return pairs


def list_arg(text, option, item=str):
    """A comma-separated option (``--models``, ``--batches``) as a list, each item converted by ``item``.

    Empty items are dropped; an empty list, or an item ``item`` refuses
    (ValueError, or a TunaError of its own), is one line naming the option.

    Examples
    --------
    >>> list_arg("100, 500", "--batches", int)
    [100, 500]
    >>> list_arg(",", "--models")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.TunaError: --models is empty: give at least one value
    """
    values = []
    for raw in text.split(","):
        raw = raw.strip()
        if not raw:
            continue
        try:
            values.append(item(raw))
        except (ValueError, TypeError):
            raise TunaError(f"{option}: {raw!r} is not a valid value") from None
    if not values:
        raise TunaError(f"{option} is empty: give at least one value")
    return values


def policies_arg(text):
    """``"cfs, tuna-scatter"`` (``--policies``) as a list of names, empty items dropped.

    Examples
    --------
    >>> policies_arg("cfs, tuna-scatter,")
    ['cfs', 'tuna-scatter']
    """
    return [p.strip() for p in text.split(",") if p.strip()]


def policy_choices():
    """The policies' names for help texts: the built-in ones, and any a program registered before it asked.

    The registry (:func:`tuna_lab.placement.policy_names`) is read only if it
    is loaded already - a program that registered a policy has loaded it; a
    plain ``tuna-lab`` start does not pay a tenth of a second to load it for
    its help (:data:`tuna_lab.placement.names.BUILTIN_POLICIES`). A name is
    checked against the registry where it is used.

    Examples
    --------
    >>> policy_choices()[:2]
    ('cfs', 'round-robin')
    """
    from ..placement.names import BUILTIN_POLICIES

    registry = sys.modules.get("tuna_lab.placement.policies")
    return BUILTIN_POLICIES if registry is None else registry.policy_names()


def policies_help(what="the placement policy"):
    """``what``, then the registered policies' names: the help of ``--policy`` and ``--policies``.

    Examples
    --------
    >>> policies_help("comma-separated placement policies")[:48]
    'comma-separated placement policies: cfs, round-r'
    """
    return f"{what}: {', '.join(policy_choices())}"


def add_strict_families_option(parser):
    """Add ``--strict-families``: fail (exit 2) instead of relaxing when the families admit no mapping.

    Without it a ``tuna-*`` solve whose families conflict returns the nearest
    mapping, says so in one line and marks it ``relaxed``; with it the
    command ends with the minimal conflicting families and the reason.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_strict_families_option(parser)
    >>> parser.parse_args(["--strict-families"]).on_infeasible
    'raise'
    >>> parser.parse_args([]).on_infeasible
    'relax'
    """
    parser.add_argument("--strict-families", dest="on_infeasible", action="store_const", const="raise",
                        default="relax",
                        help="fail with the conflicting families where they admit no mapping (default: relax "
                             "to the nearest mapping)")



def check_measure_options(args, error):
    """The one check of the options ``run``, ``sweep`` and ``tune`` share, each as the command has it.

    Every count is a positive integer (``--trials``, ``--requests``,
    ``--concurrency``; ``--seed`` non-negative), ``--max-error-rate`` is a share
    in [0, 1), ``-w``/``-t`` are bounded (:func:`~tuna_lab._checks.check_size`),
    the lab server's ``--batch``/``--batches`` fit the rows a request may carry
    (:func:`~tuna_lab.server.app.max_rows`; checked here, before a request of
    that many rows is made), and ``--app`` names a Python module. An option a
    command does not have is skipped; one it has is checked whatever the command.

    Raises
    ------
    error
        The first bad option, in one line.

    Examples
    --------
    >>> from argparse import Namespace
    >>> check_measure_options(Namespace(trials=3, concurrency=0), TunaError)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.TunaError: concurrency must be a positive integer, got 0
    """
    from .._checks import check_size, non_negative_int, positive_int

    for name in ("trials", "requests", "concurrency"):
        if getattr(args, name, None) is not None:
            positive_int(name, getattr(args, name), error)
    if getattr(args, "seed", None) is not None:
        non_negative_int("seed", args.seed, error)
    rate = getattr(args, "max_error_rate", None)
    if rate is not None and not 0 <= rate < 1:
        raise error(f"--max-error-rate must be in [0, 1), got {rate}")
    # tune has -t (with --pid) but no -w: a missing option is as good as one not given.
    workers, threads = getattr(args, "workers", None), getattr(args, "threads", None)
    if workers is not None or threads is not None:
        check_size(1 if workers is None else workers, 1 if threads is None else threads, error)
    # --app's form is AppTarget's to check (the library refuses it too); the batch is the lab server's.
    if getattr(args, "app", None) is None and getattr(args, "pid", None) is None:
        _check_batches(args, error)


def _check_batches(args, error):
    """The lab server's batches against the rows one request may carry, for each model given."""
    from ..server.app import max_rows
    from .._checks import positive_int
    from ..server.models import MODEL_FEATURES

    batches = [args.batch] if getattr(args, "batch", None) is not None else []
    if getattr(args, "batches", None) is not None:
        batches = list_arg(args.batches, "--batches", int)
    models = [args.model] if getattr(args, "model", None) is not None else ["medium"]
    if getattr(args, "models", None) is not None:
        models = list_arg(args.models, "--models")
    for batch in batches:
        positive_int("batch", batch, error)
    for model in models:
        if model not in MODEL_FEATURES:
            raise error(f"unknown model {model!r}; choose from {', '.join(MODEL_FEATURES)}")
        try:
            rows = max_rows(model)
        except TunaError as exc:
            raise error(str(exc)) from None
        big = max(batches, default=0)
        if big > rows:
            raise error(f"batch {big} exceeds the server's limit of {rows} rows per request of {model} "
                        "(TUNA_LAB_MAX_ROWS); use a smaller batch")


def target_of(args, error, sweep=False):
    """The user's server that the options name, built by measure: None (the lab server), a running one, or an app.

    :func:`target_spec_of` reads the options; :func:`~tuna_lab.measure.target_spec.build_target`
    builds and checks the target (the CLI reads no process and no pin record). For ``--pid``
    the checked :class:`~tuna_lab.measure.attached.AttachedTarget` (it keeps its workers); for
    ``--app`` a function ``(W, T) -> AppTarget``, checked once now.
    """
    from ..measure.target_spec import build_target

    return build_target(target_spec_of(args, error, sweep))


def target_spec_of(args, error, sweep=False):
    """The :class:`~tuna_lab.measure.target_spec.TargetSpec` the "your own server" options name, checked together.

    The one reading of those options for ``run``, ``sweep`` and ``tune``:
    ``--app`` or ``--pid``, not both; ``--pid`` needs ``--url`` and ``-t``
    and refuses ``-w`` and ``--python``; ``--app`` refuses ``--url`` and
    ``--front-cpus``; without either the request options are refused.

    Parameters
    ----------
    args : argparse.Namespace
    error : type
        The calling command's exception.
    sweep : bool
        A sweep: ``--pid`` is refused (a running server keeps its W and T).

    Examples
    --------
    >>> from argparse import Namespace
    >>> target_spec_of(Namespace(app=None, pid=None, header=[], path="/"), TunaError).kind
    'lab'
    """
    from .._checks import parse_cpulist
    from ..measure.target_spec import TargetSpec

    url = getattr(args, "url", None)
    if args.app is not None and args.pid is not None:
        raise error("give --app (a server tuna_lab starts) or --pid (one already running), not both")
    if args.pid is not None and sweep:
        raise error("a running server keeps its workers and threads: measure it with `run --pid --url`")
    if args.app is None and args.pid is None:
        given = [o for o in ("url", "body", "bodies", "method", "server_timing", "label", "app_dir", "server_conf",
                             "python", "front_cpus")
                 if getattr(args, o, None)] + (["header"] if args.header else []) \
            + (["path"] if args.path != "/" else [])
        if given:
            raise error(f"--{given[0].replace('_', '-')} is for your own server: give --app or --pid too")
        return TargetSpec()
    requests = {"method": args.method, "headers": tuple(args.header or ()), "body": args.body,
                "bodies": args.bodies, "server_timing": args.server_timing, "label": args.label}
    if args.pid is not None:
        if getattr(args, "python", None):
            raise error("--python is for --app (a server tuna_lab starts); a running server keeps its interpreter")
        if url is None or args.threads is None:
            raise error("--pid needs --url (where the running server answers) and -t (its threads per worker, "
                        "the main thread included)")
        if getattr(args, "workers", None) is not None:
            raise error("a running server keeps its workers: leave out -w (they are counted)")
        front = getattr(args, "front_cpus", None)
        if front is not None:
            # Parsed here; that they are the server's own CPUs (and leave it some) is measure's to check.
            front = parse_cpulist(front, "--front-cpus", error)
            if not front:
                raise error(f"--front-cpus names no CPU: {args.front_cpus!r}")
        return TargetSpec(pid=args.pid, url=url, threads=args.threads, force=getattr(args, "force", False),
                          front_cpus=front, **requests)
    if url is not None:
        raise error("--url is for a running server (--pid); with --app give --path")
    if getattr(args, "front_cpus", None) is not None:
        raise error("--front-cpus is for a running server (--pid)")
    return TargetSpec(app=args.app, path=args.path, server=args.server, app_dir=args.app_dir,
                      server_conf=args.server_conf, python=getattr(args, "python", None), **requests)


def no_valid_status(lacking):
    """Exit status 1, with one stderr line, when some promised policy has no valid trial; else 0.

    What ``run``, ``sweep`` and ``tune`` return once their results are
    printed: something ran, and some policy's every trial failed.

    Parameters
    ----------
    lacking : dict of str to list of str
        ``{cell: [policy, ...]}`` of the policies without a valid trial
        (:func:`~tuna_lab.measure.store.no_valid_trial`); empty when all have one.

    Examples
    --------
    >>> no_valid_status({})
    0
    """
    if not lacking:
        return 0
    policies = sorted({p for ps in lacking.values() for p in ps})
    where = f" (in {len(lacking)} cells)" if len(lacking) > 1 else ""
    print(f"tuna-lab: error: no valid trial of {', '.join(policies)}{where}: every trial failed "
          "(the failed: lines and the records say why)", file=sys.stderr)
    return 1


def plan_for(policy, workers, threads, topology, time_limit=None, on_infeasible="relax"):
    """The :class:`~tuna_lab.placement.plan.Plan` of ``policy`` for ``workers`` x ``threads`` on ``topology``.

    ``on_infeasible``: see :func:`~tuna_lab.placement.policies.placement`.
    """
    from ..placement import placement

    return placement(policy, workers, threads, topology, time_limit=time_limit, on_infeasible=on_infeasible).plan()


#: The "your own server" group of ``run``, ``sweep`` and ``tune``: a synopsis here, each option in docs/cli.md.
_TARGET_SYNOPSIS = {
    "run": "  --app MODULE:APP [--app-dir DIR] [--server NAME] [--server-conf FILE]\n"
           "    [--python PATH]: your app, started per policy and trial (with -w, -t)\n"
           "  --pid MASTER --url URL -t T [--force] [--front-cpus CPULIST]\n"
           "    [--sample-hz HZ]: a server already running, never restarted\n",
    "sweep": "  --app MODULE:APP [--app-dir DIR] [--server NAME] [--server-conf FILE]\n"
             "    [--python PATH]: your app, started per cell, policy and trial\n",
    "tune": "  --app MODULE:APP [--app-dir DIR] [--server NAME] [--server-conf FILE]\n"
            "    [--python PATH]: your app, started per candidate run\n"
            "  --pid MASTER --url URL -t T [--force]: one already running (policies only)\n",
}


def add_target_options(parser, command="run"):
    """Add the options that name the user's own server and its requests (:func:`target_of` reads them).

    ``command``: ``"run"`` (an app, or a running server with ``--pid``), ``"sweep"``
    (an app; ``--pid`` is refused, a running server keeps its W and T) or
    ``"tune"`` (as run, ``-t`` among them, no ``--front-cpus``). They are said
    once, in docs/cli.md ("Your own server"); the help shows them as one
    short group that points there.
    """
    hidden = argparse.SUPPRESS
    t = parser.add_argument_group(
        "your own server (each option: docs/cli.md, docs/measure-your-server.md)",
        "Instead of tuna_lab's own server:\n" + _TARGET_SYNOPSIS[command]
        + "  requests: [--path PATH] [--method METHOD] [--header NAME:VALUE]...\n"
          "    [--body FILE] [--bodies FILE.jsonl] [--server-timing NAME] [--label NAME]\n")
    t.add_argument("--app", default=None, metavar="MODULE:APP", help=hidden)
    t.add_argument("--app-dir", default=None, metavar="DIR", help=hidden)
    t.add_argument("--server", choices=("gunicorn", "uvicorn"), default="gunicorn", metavar="NAME", help=hidden)
    t.add_argument("--server-conf", default=None, metavar="FILE", help=hidden)
    t.add_argument("--python", default=None, metavar="PATH", help=hidden)
    t.add_argument("--pid", type=int, default=None, metavar="MASTER", help=hidden)
    if command != "sweep":
        t.add_argument("--url", default=None, metavar="URL", help=hidden)
        t.add_argument("--force", action="store_true", help=hidden)
    if command == "run":
        from .server_options import add_front_cpus_option

        add_front_cpus_option(t, help=hidden)
    if command == "tune":
        t.add_argument("-t", "--threads", type=int, default=None, metavar="T", help=hidden)
    t.add_argument("--path", default="/", metavar="PATH", help=hidden)
    t.add_argument("--method", default=None, metavar="METHOD", help=hidden)
    t.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help=hidden)
    t.add_argument("--body", default=None, metavar="FILE", help=hidden)
    t.add_argument("--bodies", default=None, metavar="FILE.jsonl", help=hidden)
    t.add_argument("--server-timing", default=None, metavar="NAME", help=hidden)
    t.add_argument("--label", default=None, metavar="NAME", help=hidden)


def check_duration(text, option, error=TunaError):
    """Seconds of a duration option (``--budget 10m``, ``--sla-p99 50ms``); a negative one is said as such.

    Examples
    --------
    >>> check_duration("90s", "--budget")
    90.0
    >>> check_duration("-1m", "--budget")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.TunaError: --budget must be positive, got '-1m'
    """
    from ..measure.tune.tuner import parse_duration

    if str(text).strip().startswith("-"):
        raise error(f"{option} must be positive, got {text!r}")
    return parse_duration(text, option, error)


def no_valid_status_of(source, keys=None):
    """:func:`no_valid_status` of a run's result or a results folder (its cells ``keys``)."""
    from ..measure.store import no_valid_trial

    return no_valid_status(no_valid_trial(source, keys))


def progress(line):
    """Progress goes to stderr: stdout carries only results (a table, or the one ``--json`` object)."""
    print(line, file=sys.stderr, flush=True)


def print_json(obj):
    """``obj`` as one line of strict JSON: NaN and infinities (a speedup without a baseline) become null."""
    def clean(value):
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    print(json.dumps(clean(obj), allow_nan=False, default=str))
