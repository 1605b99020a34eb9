"""``tuna-lab bench solver``: the solver's targets, measured.

Four parts, each a table row set written to one CSV:

* ``grid``: the article's 72 models (workers x threads x mode on
  ``xeon-8272cl``), solved the default way (constructive mapping, proven by
  the counting and pattern bounds where they reach it, local search and
  HiGHS otherwise; see docs/model.md) and with HiGHS
  proving every one (``prove="solver"``);
* ``pairwise``: the article's literal encoding on the small models, with a
  time limit, to cross-check optima where it finishes;
* ``scale``: ``epyc-9654-2s`` (384 logical cores) at (32, 16), (48, 8), (96, 4);
* ``toggle``: re-solving after a mode toggle and a family toggle.

Plus the peak RSS of ``tuna-lab solve`` on the largest scale case.
"""

import os
import resource
import statistics
import subprocess
import sys
import time

from ..machine import host
from ..machine.topology import Topology
from .tuna import TunaModel

__all__ = ["run_solver_bench", "ARTICLE_WORKERS", "ARTICLE_THREADS", "SCALE_CASES"]

ARTICLE_WORKERS = (2, 4, 6, 8, 12, 16)
ARTICLE_THREADS = (2, 4, 6, 8, 12, 16)
SCALE_CASES = ((32, 16), (48, 8), (96, 4))
MODES = ("scatter", "compact")


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


def _scale(rows, quick, limit):
    topo = Topology.preset("epyc-9654-2s")
    for w, t in SCALE_CASES[:1] if quick else SCALE_CASES:
        for mode in MODES:
            model = TunaModel(w, t, topo, mode)
            mapping, wall = _timed(model, time_limit=limit)
            rows.append(_row("scale", topo, model, mapping, "default", wall))
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


def _peak_rss(rows, limit):
    w, t = SCALE_CASES[0]
    cmd = [sys.executable, "-m", "tuna_lab.cli", "solve", "-w", str(w), "-t", str(t),
           "--preset", "epyc-9654-2s", "--mode", "compact", "--time-limit", str(limit), "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rows.append({"part": "memory", "topology": "epyc-9654-2s", "workers": w, "threads": t,
                 "mode": "compact", "route": "tuna-lab solve", "wall_s": round(wall, 3),
                 "status": f"exit {proc.returncode}; peak RSS {max(peak_kib, before) / 1024:.0f} MiB"})
    _progress(rows[-1])


def _progress(row):
    keys = ("part", "workers", "threads", "mode", "route", "encoding", "build_s", "solve_s", "wall_s",
            "status", "objective", "gap")
    print("  ".join(f"{row.get(k)}" for k in keys if row.get(k) is not None), flush=True)


def _summary(df):
    import pandas as pd

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
    s = df[df.part == "scale"]
    for _, r in s.iterrows():
        bound = "" if r.get("bound") is None or pd.isna(r.get("bound")) else f", bound {r.bound:.6g}"
        lines.append(f"- scale {int(r.workers)}x{int(r.threads)} {r['mode']}: {r.status}, wall {r.wall_s:.2f} s, "
                     f"objective {r.objective:.6g}{bound}, gap {r.gap:.4g}, violations {int(r.violations)}")
    for _, r in df[df.part.isin(["toggle", "memory"])].iterrows():
        lines.append(f"- {r.route}: {r.wall_s:.4f} s ({r.status})")
    return lines


def run_solver_bench(args):
    """Run the benchmark; print the table, write the CSV (and a Markdown report if asked)."""
    import pandas as pd

    rows = []
    quick = bool(getattr(args, "quick", False))
    print("# tuna-lab bench solver", "(quick)" if quick else "", flush=True)
    _grid(rows, quick)
    if getattr(args, "pairwise_limit", 0):
        _pairwise(rows, args.pairwise_limit, quick)
    _scale(rows, quick, limit=5.0)
    _toggle(rows, quick)
    _peak_rss(rows, limit=5.0)
    df = pd.DataFrame(rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    df.to_csv(args.out, index=False)
    summary = _summary(df)
    print("\n".join(["", "## Summary"] + summary))
    print(f"\nwrote {args.out}")
    doc = getattr(args, "doc", None)
    if doc:
        _write_doc(doc, df, summary)
        print(f"wrote {doc}")
    return 0


def _write_doc(path, df, summary):
    import cvxpy

    cols = ["part", "route", "workers", "threads", "mode", "encoding", "build_s", "solve_s", "wall_s",
            "status", "objective", "gap"]
    table = df[[c for c in cols if c in df.columns]].copy()
    table = table.astype(object).where(table.notna(), "")
    header = "| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns) + "\n"
    body = "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in table.itertuples(index=False))
    text = (
        "# Solver benchmark\n\n"
        f"Produced by `make bench` (`tuna-lab bench solver`) on {time.strftime('%Y-%m-%d')}; "
        f"machine: {host.describe()}; cvxpy {cvxpy.__version__}.\n\n"
        "## Summary\n\n" + "\n".join(summary) + "\n\n## All rows\n\n" + header + body)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
