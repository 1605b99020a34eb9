"""``tuna-lab bench solver``: the solver's targets, measured.

Four parts, each a table row set written to one CSV:

* ``grid``: the article's 72 models (workers x threads x mode on
  ``xeon-8272cl``), solved the default way (constructive mapping, proven by
  the counting and pattern bounds where they reach it, local search and
  HiGHS otherwise; see docs/model.md) and with HiGHS
  proving every one (``prove="solver"``);
* ``pairwise``: the article's literal encoding on the small models, with a
  time limit, to cross-check optima where it finishes;
* ``scale``: the many-core cases (:data:`SCALE_SHAPES`, :data:`UNEVEN_SHAPES`)
  with the default families and without the physical analogues, on
  ``epyc-9654-2s`` (384 logical cores, 10 s limit) and the same W:T shapes
  on ``epyc-9965-2s`` (768 logical cores, W doubled so that W x T scales
  with the cores, the first three uneven shapes, 30 s limit): objective,
  proof and its certificate, the gap,
  the in-process wall time and whether the time limit was honoured (wall
  <= limit + 0.5 s); each case runs in a forked child so that the models
  it builds do not pile up in the benchmark's memory. For a few of them
  (:data:`CLI_CASES`) also ``tuna-lab solve`` as a process: its wall time
  and peak RSS;
* ``toggle``: re-solving after a mode toggle and a family toggle;
* ``relaxed`` (families that admit no mapping): every configuration of the article machine's count
  (``W <= 2C+1``, ``T <= 8``, ``WT <= 4C``: 283 of them, both modes),
  feasible or relaxed, against 1 s each; and the shapes of
  ``epyc-9654-2s`` whose families admit no mapping (found by the counting
  argument of :func:`~tuna_lab.model.explain.counting_conflict`, a few per
  ``T``), relaxed within a 10 s limit.

``--scale-only`` runs the scale part alone and, with ``--doc``, replaces
only its section of an existing report; ``--relaxed-only`` likewise the
relaxed part.
"""

import os
import statistics
import subprocess
import sys
import time

from .. import _files
from ..machine import host
from ..machine.topology import Topology
from ..model.tuna import TunaModel

__all__ = ["run_solver_bench", "ARTICLE_WORKERS", "ARTICLE_THREADS", "SCALE_SHAPES", "UNEVEN_SHAPES",
           "SCALE_MACHINES", "CLI_CASES"]

ARTICLE_WORKERS = (2, 4, 6, 8, 12, 16)
ARTICLE_THREADS = (2, 4, 6, 8, 12, 16)
MODES = ("scatter", "compact")
#: Workers x threads of the scale goal on 384 logical cores: shapes a many-core machine is run with, each
#: to be proven optimal within the time limit (a solver that needs minutes there is no help to a user).
SCALE_SHAPES = ((32, 16), (48, 8), (64, 6), (96, 4), (192, 2), (16, 24), (24, 32))
#: Shapes that do not divide the 384-core machine evenly (three typical ones first; then shapes a sweep
#: found unproven: mains alone on their physical cores (40x8, 44x8, 26x14), a worker's two fragments in
#: one domain (30x16), workers far bigger than a domain (10x36), HiGHS past its limit (33x16), a single
#: main's sibling left to other workers (50x10), both load rules at once (34x16)).
UNEVEN_SHAPES = ((28, 14), (40, 12), (36, 10), (20, 20), (44, 9), (52, 7), (30, 16), (40, 8), (44, 8), (26, 14),
                 (10, 36), (33, 16), (50, 10), (34, 16))
#: ``(preset, time limit, worker factor)``: the machines of the scale part; on
#: the 768-core one the shapes keep T and double W (W x T scales with C).
SCALE_MACHINES = (("epyc-9654-2s", 10.0, 1), ("epyc-9965-2s", 30.0, 2))
#: ``(preset, W, T, mode)`` also run as ``tuna-lab solve`` processes (wall time, peak RSS).
CLI_CASES = (("epyc-9654-2s", 32, 16, "compact"), ("epyc-9654-2s", 40, 12, "compact"),
             ("epyc-9654-2s", 36, 10, "compact"), ("epyc-9965-2s", 64, 16, "compact"),
             ("epyc-9965-2s", 80, 12, "compact"))
#: The physical analogues of (2)/(11-12), removed in the scale part's second family set.
PHYSICAL = ("8p", "11p-12p")
#: Seconds over the time limit a solve may take: what a process needs to return after its deadline
#: (reading HiGHS's answer back, killing its child), not more, or a caller's own deadline slips.
OVERRUN = 0.5
#: Peak RSS goal of ``tuna-lab solve``: the models of 768 cores must fit a small VM's memory.
RSS_GOAL_MIB = 2048


def _row(part, topo, model, mapping, route, wall):
    inst = model.instance
    return {
        "part": part, "topology": topo.name, "workers": inst.W, "threads": inst.T, "mode": inst.mode,
        "route": route, "encoding": mapping.encoding,
        "build_s": round(mapping.build_seconds, 4), "solve_s": round(mapping.solve_seconds, 4),
        "wall_s": round(wall, 4), "status": mapping.status, "proven_optimal": mapping.proven_optimal,
        "objective": mapping.objective, "bound": mapping.bound,
        "gap": None if mapping.gap is None else round(mapping.gap, 6),
        "violations": len(mapping.verify()),
    }


def _timed(model, **kw):
    t0 = time.perf_counter()
    mapping = model.solve(**kw)
    return mapping, time.perf_counter() - t0


def _grid(rows, quick):
    topo = Topology.preset("xeon-8272cl")
    workers = ARTICLE_WORKERS[:2] if quick else ARTICLE_WORKERS
    threads = ARTICLE_THREADS[:2] if quick else ARTICLE_THREADS
    # one untimed solve of each route first: the solver's modules (highspy, and cvxpy for HiGHS) are
    # imported on first use, and the timed solves measure solving, not a first import from a cold disk
    for mode, prove in (("compact", "auto"), ("compact", "solver")):
        TunaModel(2, 2, topo, mode).solve(prove=prove, time_limit=30)
    for route, prove in (("default", "auto"), ("highs", "solver")):
        for w in workers:
            for t in threads:
                for mode in MODES:
                    model = TunaModel(w, t, topo, mode)
                    mapping, wall = _timed(model, prove=prove, time_limit=30)
                    rows.append(_row("grid", topo, model, mapping, route, wall))
                    _progress(rows[-1])


def _pairwise(rows, limit, quick):
    topo = Topology.preset("xeon-8272cl")
    cases = [(2, 2)] if quick else [(2, 2), (2, 4), (4, 2)]
    for w, t in cases:
        for mode in MODES:
            model = TunaModel(w, t, topo, mode, encoding="pairwise")
            try:
                mapping, wall = _timed(model, prove="solver", warm_start=False, time_limit=limit)
            except Exception as exc:  # a time limit without a solution is a result here
                print(f"  pairwise {w}x{t} {mode}: {exc}", file=sys.stderr)
                continue
            rows.append(_row("pairwise", topo, model, mapping, "literal", wall))
            _progress(rows[-1])


def _scale_cases(quick):
    """``(preset, limit, W, T, mode, families)`` of the scale part, in order."""
    cases = []
    for preset, limit, factor in SCALE_MACHINES:
        shapes = [(w * factor, t) for w, t in SCALE_SHAPES]
        uneven = [(w * factor, t) for w, t in UNEVEN_SHAPES]
        if factor > 1:
            uneven = uneven[:3]           # the three typical uneven shapes, doubled: the bigger machine's
            #                               cases take 30 s each
        if quick:
            shapes, uneven = shapes[:1], uneven[:1]
        for w, t in shapes + uneven:
            for mode in MODES:
                cases.append((preset, limit, w, t, mode, "default"))
                cases.append((preset, limit, w, t, mode, "no physical"))
        if quick:
            break
    return cases


def _scale_row(preset, limit, w, t, mode, families):
    """One scale case solved in this process: the row (run in a forked child)."""
    topo = Topology.preset(preset)
    model = TunaModel(w, t, topo, mode)
    if families == "no physical":
        model = model.without(*PHYSICAL)
    row = {"part": "scale", "topology": preset, "workers": w, "threads": t, "mode": mode,
           "families": families, "route": "default", "limit_s": limit}
    t0 = time.perf_counter()
    try:
        mapping = model.solve(time_limit=limit)
    except Exception as exc:   # a failed case is a row of the report, not the end of the bench
        wall = time.perf_counter() - t0
        row.update(status=f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200],
                   wall_s=round(wall, 3), proven_optimal=False, honoured=wall <= limit + OVERRUN)
        return row
    wall = time.perf_counter() - t0
    cert = mapping.certificate or {}
    row.update(encoding=mapping.encoding, build_s=round(mapping.build_seconds, 4),
               solve_s=round(mapping.solve_seconds, 4), wall_s=round(wall, 3), status=mapping.status,
               proven_optimal=bool(mapping.proven_optimal), objective=mapping.objective,
               bound=mapping.bound, gap=None if mapping.gap is None else round(mapping.gap, 6),
               certificate=cert.get("name"), step=cert.get("step"), dual_bound=cert.get("dual_bound"),
               violations=len(mapping.verify()), honoured=wall <= limit + OVERRUN,
               notes=" | ".join(mapping.notes))
    return row


def _in_child(fn, *args):
    """``fn(*args)`` in a forked child (its memory goes with it); an error row if it dies."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def target():
        try:
            send.send(fn(*args))
        except BaseException as exc:
            send.send({"status": f"error: {type(exc).__name__}: {exc}"[:200]})
        send.close()

    proc = ctx.Process(target=target)     # not a daemon: its solve forks HiGHS
    proc.start()
    send.close()
    try:
        return receive.recv()
    except EOFError:
        return {"status": f"error: the bench's child ended with status {proc.exitcode}"}
    finally:
        proc.join()
        receive.close()


def _scale(rows, quick):
    for preset, limit, w, t, mode, families in _scale_cases(quick):
        row = _in_child(_scale_row, preset, limit, w, t, mode, families)
        base = {"part": "scale", "topology": preset, "workers": w, "threads": t, "mode": mode,
                "families": families, "route": "default", "limit_s": limit}
        rows.append({**base, **row})
        _progress(rows[-1])


def _cli_run(preset, w, t, mode, limit):
    """``tuna-lab solve --json`` as a process: ``(wall s, peak RSS MiB, exit status, JSON or None)``.

    The peak RSS is the process's and its children's (HiGHS runs in one),
    from ``wait4`` on that process alone.
    """
    import json
    import tempfile

    cmd = [sys.executable, "-m", "tuna_lab.cli", "solve", "-w", str(w), "-t", str(t),
           "--preset", preset, "--mode", mode, "--time-limit", str(limit), "--json"]
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    return wall, usage.ru_maxrss / 1024, proc.returncode, data


def _cli(rows, quick):
    limits = {preset: limit for preset, limit, _ in SCALE_MACHINES}
    for preset, w, t, mode in CLI_CASES[:1] if quick else CLI_CASES:
        limit = limits[preset]
        wall, rss, code, data = _cli_run(preset, w, t, mode, limit)
        row = {"part": "cli", "topology": preset, "workers": w, "threads": t, "mode": mode,
               "families": "default", "route": "tuna-lab solve", "limit_s": limit, "wall_s": round(wall, 3),
               "peak_rss_mib": round(rss), "honoured": wall <= limit + OVERRUN,
               "status": f"exit {code}" if data is None else data["status"]}
        if data is not None:
            row.update(proven_optimal=data["proven_optimal"], objective=data["objective"], gap=data["gap"],
                       certificate=(data.get("certificate") or {}).get("name"))
        rows.append(row)
        _progress(rows[-1])


def _toggle(rows, quick):
    """Median re-solve time after a mode toggle and after a family toggle."""
    topo = Topology.preset("xeon-8272cl")
    workers = ARTICLE_WORKERS[:2] if quick else ARTICLE_WORKERS
    threads = ARTICLE_THREADS[:2] if quick else ARTICLE_THREADS
    times = {"mode": [], "family": []}
    for w in workers:
        for t in threads:
            base = TunaModel(w, t, topo, "scatter")
            base.solve()
            for kind, other in (("mode", base.with_mode("compact")), ("family", base.without("11-12"))):
                for model in (other, base, other):           # toggle, toggle back, toggle again
                    _, wall = _timed(model)
                    times[kind].append(wall)
    for kind, values in times.items():
        rows.append({"part": "toggle", "topology": topo.name, "route": f"{kind} toggle",
                     "wall_s": round(statistics.median(values), 4),
                     "status": f"median of {len(values)}; max {max(values):.3f}s"})
        _progress(rows[-1])


#: ``(preset, time limit)`` of the relaxed part's large machine, and its shapes per T (first, middle, last
#: of the conflicting W).
RELAXED_MACHINE = ("epyc-9654-2s", 10.0)


def _article_count(C):
    """The configurations a user may ask of the article's machine: ``W <= 2C+1``, ``T <= 8``, ``WT <= 4C``."""
    return [(w, t) for t in range(1, 9) for w in range(1, 2 * C + 2) if w * t <= 4 * C]


def _relaxed_row(preset, limit, w, t, mode):
    """One configuration solved (relaxed if its families conflict): its row."""
    topo = Topology.preset(preset)
    model = TunaModel(w, t, topo, mode)
    row = {"part": "relaxed", "topology": preset, "workers": w, "threads": t, "mode": mode,
           "route": "default", "limit_s": limit}
    t0 = time.perf_counter()
    try:
        mapping = model.solve(time_limit=limit)
    except Exception as exc:   # a failed case is a row of the report
        row.update(status=f"error: {type(exc).__name__}: {exc}"[:200], wall_s=round(time.perf_counter() - t0, 3),
                   proven_optimal=False)
        return row
    wall = time.perf_counter() - t0
    others = [v.family for v in mapping.verify() if v.family not in {r.family for r in mapping.relaxed}]
    row.update(encoding=mapping.encoding, wall_s=round(wall, 4), status=mapping.status,
               proven_optimal=bool(mapping.proven_optimal), objective=mapping.objective, bound=mapping.bound,
               gap=None if mapping.gap is None else round(mapping.gap, 6),
               relaxed="; ".join(f"{r.family}:{r.amount:g}" for r in mapping.relaxed),
               violations=len(others))
    return row


def _relaxed(rows, quick):
    from ..model.caps import Caps
    from ..model.explain import counting_conflict
    from ..model.instance import Instance

    topo = Topology.preset("xeon-8272cl")
    grid = _article_count(topo.n_logical)
    if quick:
        grid = [(w, t) for w, t in grid if t == 2 and 15 <= w <= 18]
    for mode in MODES:
        for w, t in grid:
            rows.append(_relaxed_row("xeon-8272cl", 30.0, w, t, mode))
            if rows[-1]["status"] == "relaxed" or rows[-1]["wall_s"] > 1.0:
                _progress(rows[-1])
    preset, limit = RELAXED_MACHINE
    big = Topology.preset(preset)
    shapes = []
    for t in range(2, 9):
        ws = [w for w, tt in _article_count(big.n_logical) if tt == t and counting_conflict(
            Caps.of(Instance(w, t, big), TunaModel(1, 1, big).families)) is not None]
        if ws:
            shapes += [(ws[0], t), (ws[len(ws) // 2], t), (ws[-1], t)]
    if quick:
        shapes = shapes[:1]
    for w, t in shapes:
        for mode in MODES:
            row = _in_child(_relaxed_row, preset, limit, w, t, mode)
            rows.append({"part": "relaxed", "topology": preset, "workers": w, "threads": t, "mode": mode,
                         "limit_s": limit, **row})
            _progress(rows[-1])


def _relaxed_goals(df):
    """The relaxed part's goals: a placement (feasible, or relaxed) for every configuration, in time."""
    r = df[df.part == "relaxed"] if "part" in df else df.iloc[0:0]
    lines = []
    for preset, limit in (("xeon-8272cl", 1.0), RELAXED_MACHINE):
        m = r[r.topology == preset]
        if not len(m):
            continue
        placed = m[m.status.isin(["optimal", "relaxed", "time_limit", "constructed"]) & (m.violations == 0)]
        fast = placed[placed.wall_s <= limit]
        slow = [f"{int(x.workers)}x{int(x.threads)} {x['mode']} {x.wall_s:.2f} s" for _, x in m.iterrows()
                if x.name not in fast.index]
        lines.append(f"- {_verdict(len(fast) == len(m))}: {preset}: a placement (feasible, or relaxed with only "
                     f"the relaxed family violated) within {limit:g} s: {len(fast)}/{len(m)} "
                     f"({int((m.status == 'relaxed').sum())} relaxed, {int(m.proven_optimal.fillna(False).sum())} "
                     f"proven; max {m.wall_s.max():.2f} s)" + (f"; not: {', '.join(slow[:12])}" if slow else ""))
    return lines


def _progress(row):
    keys = ("part", "topology", "workers", "threads", "mode", "families", "route", "encoding", "build_s",
            "solve_s", "wall_s", "status", "objective", "certificate", "gap", "peak_rss_mib")
    print("  ".join(f"{row.get(k)}" for k in keys if row.get(k) is not None), flush=True)


def _summary(df):
    lines = []
    for route in ("default", "highs"):
        g = df[(df.part == "grid") & (df.route == route)]
        if len(g):
            total = g.build_s.sum() + g.solve_s.sum()
            lines.append(
                f"- article grid, {route}: {int(g.proven_optimal.sum())}/{len(g)} proven optimal; "
                f"solve s max {g.solve_s.max():.3f}, median {g.solve_s.median():.3f}; "
                f"{int((g.solve_s <= 1.0).sum())}/{len(g)} within 1 s; total incl. building {total:.2f} s; "
                f"wall {g.wall_s.sum():.2f} s; "
                f"{int((g.encoding == 'constructive+bound').sum())}/{len(g)} proven by construction + bound")
    p = df[df.part == "pairwise"]
    g = df[(df.part == "grid") & (df.route == "default")]
    for _, r in p.iterrows():
        match = g[(g.workers == r.workers) & (g.threads == r.threads) & (g["mode"] == r["mode"])]
        if len(match):
            same = abs(match.objective.iloc[0] - r.objective) < 1e-6
            lines.append(f"- literal encoding {int(r.workers)}x{int(r.threads)} {r['mode']}: {r.status} in "
                         f"{r.solve_s:.1f} s, objective {r.objective:g} "
                         + ("(equal to the fast encoding's)" if same and r.proven_optimal else
                            f"(fast encoding: {match.objective.iloc[0]:g})"))
    for _, r in df[df.part == "toggle"].iterrows():
        lines.append(f"- {r.route}: {r.wall_s:.4f} s ({r.status})")
    return lines + _regression_goals(df)


def _verdict(ok):
    return "PASS" if ok else "FAIL"


def _goals(df):
    """The scale goals (proven in time, the limit honoured, memory), each ``- PASS/FAIL: goal (evidence)``,
    for the parts that ran."""
    lines = []
    s = df[df.part == "scale"] if "part" in df else df.iloc[0:0]
    if len(s):
        even = {(w, t) for w, t in SCALE_SHAPES}
        uneven = {(w, t) for w, t in UNEVEN_SHAPES}
        for preset, limit, factor in SCALE_MACHINES:
            m = s[s.topology == preset]
            if not len(m):
                continue
            shapes = {(w * factor, t) for w, t in even}
            odd = {(w * factor, t) for w, t in uneven}
            groups = [("even shapes, default families", m[m.families == "default"], shapes),
                      ("even shapes, without the physical analogues", m[m.families == "no physical"], shapes),
                      ("uneven shapes, default families", m[m.families == "default"], odd),
                      ("uneven shapes, without the physical analogues", m[m.families == "no physical"], odd)]
            for label, rows, which in groups:
                rows = rows[[(int(w), int(t)) in which for w, t in zip(rows.workers, rows.threads)]]
                if not len(rows):
                    continue
                good = rows[rows.proven_optimal.fillna(False).astype(bool) & (rows.wall_s <= limit)]
                missing = [f"{int(r.workers)}x{int(r.threads)} {r['mode']}" for _, r in rows.iterrows()
                           if r.name not in good.index]
                lines.append(f"- {_verdict(len(good) == len(rows))}: {preset} {label}: proven optimal within "
                             f"{limit:g} s (in process) {len(good)}/{len(rows)}"
                             + (f"; not: {', '.join(missing)}" if missing else ""))
        late = s[~s.honoured.fillna(False).astype(bool)]
        lines.append(f"- {_verdict(not len(late))}: time limit honoured (wall <= limit + {OVERRUN:g} s) in "
                     f"{len(s) - len(late)}/{len(s)} scale rows"
                     + ("; late: " + ", ".join(f"{r.topology} {int(r.workers)}x{int(r.threads)} {r['mode']} "
                                               f"{r.wall_s:.2f} s" for _, r in late.iterrows()) if len(late) else ""))
    c = df[df.part == "cli"] if "part" in df else df.iloc[0:0]
    if len(c):
        late = c[~c.honoured.fillna(False).astype(bool)]
        lines.append(f"- {_verdict(not len(late))}: `tuna-lab solve` process within limit + {OVERRUN:g} s: "
                     f"{len(c) - len(late)}/{len(c)} (max {c.wall_s.max():.2f} s)")
        lines.append(f"- {_verdict(bool((c.peak_rss_mib <= RSS_GOAL_MIB).all()))}: peak RSS <= "
                     f"{RSS_GOAL_MIB / 1024:g} GiB: max {c.peak_rss_mib.max():.0f} MiB over {len(c)} "
                     "`tuna-lab solve` processes")
    return lines


def _regression_goals(df):
    """The no-regression goals (the article grid proven within 1 s, toggles re-solved within 100 ms), for the
    parts that ran: the scale work must not slow the small models a notebook solves."""
    lines = []
    g = df[(df.part == "grid") & (df.route == "default")] if "part" in df else df.iloc[0:0]
    if len(g):
        ok = bool(g.proven_optimal.all() and (g.wall_s <= 1.0).all())
        lines.append(f"- {_verdict(ok)}: article grid all proven within 1 s: "
                     f"{int((g.proven_optimal & (g.wall_s <= 1.0)).sum())}/{len(g)}")
    t = df[df.part == "toggle"] if "part" in df else df.iloc[0:0]
    if len(t):
        lines.append(f"- {_verdict(bool((t.wall_s <= 0.1).all()))}: toggle re-solves <= 100 ms (median): "
                     + ", ".join(f"{r.route} {r.wall_s * 1000:.1f} ms" for _, r in t.iterrows()))
    return lines


def run_solver_bench(args):
    """Run the benchmark; print the table, write the CSV (and a Markdown report if asked)."""
    import pandas as pd

    rows = []
    quick = bool(getattr(args, "quick", False))
    scale_only = bool(getattr(args, "scale_only", False))
    print("# tuna-lab bench solver", "(quick)" if quick else "", "(scale only)" if scale_only else "", flush=True)
    relaxed_only = bool(getattr(args, "relaxed_only", False))
    if not scale_only and not relaxed_only:
        _grid(rows, quick)
        if getattr(args, "pairwise_limit", 0):
            _pairwise(rows, args.pairwise_limit, quick)
    if not relaxed_only:
        _scale(rows, quick)
        _cli(rows, quick)
    if not scale_only and not relaxed_only:
        _toggle(rows, quick)
    if not scale_only:
        _relaxed(rows, quick)
    df = pd.DataFrame(rows)
    # Never through a link, whole or not at all (`tuna-lab bench` checked the path before the work).
    _files.write_atomic(args.out, df.to_csv(index=False), parents=True)
    summary = _summary(df)
    goals, relaxed_goals = _goals(df), _relaxed_goals(df)
    print("\n".join(["", "## Summary"] + summary + ["", "## Goals: scale"] + goals
                    + ["", "## Goals: relaxed placements"] + relaxed_goals))
    print("\n" + _scale_table(df))
    print("\n" + _relaxed_table(df))
    print(f"\nwrote {args.out}")
    doc = getattr(args, "doc", None)
    if doc:
        if relaxed_only:
            _replace_section(doc, _RELAXED_BEGIN, _RELAXED_END, _relaxed_section(df, relaxed_goals))
        else:
            _write_doc(doc, df, summary, goals, scale_only)
            if not scale_only:
                _replace_section(doc, _RELAXED_BEGIN, _RELAXED_END, _relaxed_section(df, relaxed_goals))
        print(f"wrote {doc}")
    return 0


_SCALE_BEGIN = "<!-- scale: begin (tuna-lab bench solver --scale-only replaces this part) -->"
_SCALE_END = "<!-- scale: end -->"
_RELAXED_BEGIN = "<!-- relaxed: begin (tuna-lab bench solver --relaxed-only replaces this part) -->"
_RELAXED_END = "<!-- relaxed: end -->"


def _replace_section(path, begin, end, section):
    """Put ``section`` (which starts with ``begin`` and ends with ``end``) in place of the report's own, else last."""
    old = _old_doc(path)
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        text = old.rstrip("\n") + "\n\n" + section
    _files.write_atomic(path, text, parents=True)


def _old_doc(path):
    """The report at ``path`` as it is (a section of it is replaced), or a fresh one's title.

    Read by the one file layer: never through a link, nor a FIFO, a device or a file of gigabytes.
    """
    try:
        return _files.read_text(path, follow=False)
    except FileNotFoundError:
        return "# Solver benchmark\n"


def _relaxed_table(df):
    """The relaxed part's Markdown table: the configurations that relax, and any over their limit."""
    r = df[df.part == "relaxed"] if "part" in df else df.iloc[0:0]
    if not len(r):
        return ""
    limit = r.topology.map({"xeon-8272cl": 1.0}).fillna(r.limit_s)
    r = r[(r.status != "optimal") | (r.wall_s > limit)]
    head = ("| machine | case | mode | status | relaxed | objective | proven | route | seconds | limit |\n|"
            + "---|" * 10 + "\n")
    body = ["| " + " | ".join([
        str(x.topology), f"{int(x.workers)}x{int(x.threads)}", str(x["mode"]), str(x.status),
        _fmt(x.get("relaxed")), _fmt(x.get("objective"), ".10g"), _fmt(bool(x.proven_optimal)),
        _fmt(x.get("encoding")), _fmt(x.wall_s, ".2f"), _fmt(float(lim), "g")]) + " |"
        for (_, x), lim in zip(r.iterrows(), limit[r.index])]
    return head + "\n".join(body) + "\n"


def _relaxed_section(df, goals):
    note = ("Every configuration of the issue's count on the article's machine (`W <= 2C+1`, `T <= 8`, "
            "`WT <= 4C`: 283, both modes) solved in process against 1 s, and the `epyc-9654-2s` shapes whose "
            "families conflict (the counting argument's, first, middle and last W per T) in a forked child "
            "against 10 s. `seconds` is the wall time of `TunaModel.solve` with the explanation and the "
            "relaxation included; `relaxed` is what the mapping exceeds (family: amount). The table lists "
            "the relaxed configurations and any row over its limit; the CSV has them all.")
    return (f"{_RELAXED_BEGIN}\n## Relaxed placements\n\nMeasured on "
            f"{time.strftime('%Y-%m-%d %H:%M')}; machine: {host.describe()}.\n\n" + note
            + "\n\n### Goals\n\n" + "\n".join(goals) + "\n\n### Cases\n\n" + _relaxed_table(df)
            + _RELAXED_END + "\n")


def _fmt(value, spec=""):
    import pandas as pd

    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, (bool,)) or spec == "":
        return str(value)
    return format(value, spec)


def _scale_table(df):
    """The scale part's Markdown table: one row per case (and per ``tuna-lab solve`` process)."""
    s = df[df.part.isin(["scale", "cli"])] if "part" in df else df.iloc[0:0]
    if not len(s):
        return ""
    head = ("| machine | case | mode | families | run | objective | proven | certificate | bound | gap | "
            "step | seconds | limit | honoured | peak RSS MiB |\n|" + "---|" * 15 + "\n")
    body = []
    for _, r in s.iterrows():
        run = "in process" if r.part == "scale" else "`tuna-lab solve`"
        proven = r.get("proven_optimal")
        body.append("| " + " | ".join([
            str(r.topology), f"{int(r.workers)}x{int(r.threads)}", str(r["mode"]), str(r.get("families", "")),
            run, _fmt(r.get("objective"), ".10g"), _fmt(bool(proven) if proven is not None else None),
            _fmt(r.get("certificate")) or _fmt(r.get("status")), _fmt(r.get("bound"), ".10g"),
            _fmt(r.get("gap"), ".4g"), _fmt(r.get("step"), "g"), _fmt(r.get("wall_s"), ".2f"),
            _fmt(r.get("limit_s"), "g"), "yes" if r.get("honoured") else "**no**",
            _fmt(r.get("peak_rss_mib"), ".0f")]) + " |")
    return head + "\n".join(body) + "\n"


def _scale_section(df, goals):
    note = ("Each case solved with the time limit shown: in process (a forked child of the benchmark; "
            "`seconds` = wall time of `TunaModel.solve`, the span the limit covers) and, for a few, as a "
            "`tuna-lab solve --json` process (`seconds` = the process's wall time: the command's "
            "`--time-limit` counts from its start, imports of ~1 s included; peak RSS of the process and "
            "its HiGHS child). `certificate` names what proves the "
            "bound: `counting`, the pattern bounds (`sibling-pattern`, `domain-pattern`, "
            "`fragment-pattern`, joined by `+`) or `highs` (HiGHS's dual bound); `step` is the lattice "
            "step of the objective values, so a bound less than one step above the objective proves it. "
            f"Honoured: wall <= limit + {OVERRUN:g} s. On `epyc-9965-2s` the shapes keep T and double W.")
    return (f"{_SCALE_BEGIN}\n## Scale\n\nMeasured on {time.strftime('%Y-%m-%d %H:%M')}; "
            f"machine: {host.describe()}.\n\n"
            + note + "\n\n### Goals\n\n" + "\n".join(goals) + "\n\n### Cases\n\n"
            + _scale_table(df) + _SCALE_END + "\n")


def _write_doc(path, df, summary, goals, scale_only=False):
    import cvxpy

    scale = _scale_section(df, goals)
    if scale_only:
        _replace_section(path, _SCALE_BEGIN, _SCALE_END, scale)
        return
    grid = df[~df.part.isin(["scale", "cli"])]
    cols = ["part", "route", "workers", "threads", "mode", "encoding", "build_s", "solve_s", "wall_s",
            "status", "objective", "gap"]
    table = grid[[c for c in cols if c in grid.columns]].copy()
    table = table.astype(object).where(table.notna(), "")
    header = "| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns) + "\n"
    body = "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in table.itertuples(index=False))
    text = (
        "# Solver benchmark\n\n"
        f"Produced by `make bench` (`tuna-lab bench solver`) on {time.strftime('%Y-%m-%d')}; "
        f"machine: {host.describe()}; cvxpy {cvxpy.__version__}.\n\n"
        "## Summary\n\n" + "\n".join(summary) + "\n\n" + scale
        + "\n## Article grid, literal encoding and toggles: all rows\n\n" + header + body)
    _files.write_atomic(path, text, parents=True)
