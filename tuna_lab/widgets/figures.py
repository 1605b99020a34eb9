"""Plotly figures drawn from the controllers' tidy tables (no ipywidgets), and their still images.

The views copy these figures into their ``FigureWidget``; notebooks and
reports can show them as they are. :func:`static` turns any plotly figure
into a PNG that a notebook stores, so that a reader who runs nothing (on
GitHub, in the docs) still sees it; :class:`StaticRenderer` adds that PNG to
every figure a notebook displays (:func:`tuna_lab.notebook.setup` turns it on).

Examples
--------
>>> from tuna_lab.widgets import ModeExplorer
>>> ex = ModeExplorer("xeon-8272cl", workers=2, threads=2)
>>> fig = mapping_figure(ex.grid(), ex.threads_frame())
>>> [t.name for t in fig.data]
['cores', 'load', 'worker 0', 'worker 1']
"""

import base64
import math
import warnings

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import qualitative
from plotly.io.base_renderers import MimetypeRenderer

from .._checks import one_line

__all__ = ["mapping_figure", "distance_figure", "pair_distance_figure", "tree_figure", "loads_figure", "p99_figure", "static",
           "StaticRenderer"]

_TEMPLATE = "plotly_white"
# Dark24 keeps 24 workers apart; beyond that colours repeat but markers still differ by position.
_WORKER_COLORS = qualitative.Dark24
_DOMAIN_GAP = 1          # empty columns between two cache domains
_MAX_TICKS = 48          # above this many physical cores, core tick labels would overlap
# Light cells, so that the thread markers and the load written on them stay readable.
_LOAD_SCALE = [[0, "#f7fbff"], [1, "#6baed6"]]


def _cell_x(grid):
    """x of every logical core: its column, shifted right by one gap per earlier domain."""
    domain_rank = {d: i for i, d in enumerate(dict.fromkeys(grid.sort_values("column")["domain"]))}
    return grid["column"].to_numpy() + _DOMAIN_GAP * grid["domain"].map(domain_rank).to_numpy()


def _thread_offsets(slot, n):
    """Offsets of the ``slot``-th of ``n`` threads inside a unit cell: up to 4 per row, rows stacked."""
    rows = max(1, math.ceil(n / 4))
    per_row = max(1, math.ceil(n / rows))
    r, c = divmod(slot, per_row)
    dx = (c - (per_row - 1) / 2) * 0.8 / per_row
    dy = -((r - (rows - 1) / 2) * 0.22) - 0.08     # a little low: the load is written above
    return dx, dy


def mapping_figure(grid, threads, title="", highlight=()):
    """The mapping as a grid of cores grouped by cache domain, each thread a marker coloured by worker.

    Parameters
    ----------
    grid : pandas.DataFrame
        :func:`tuna_lab.widgets.controllers.core_grid`: one row per logical core.
    threads : pandas.DataFrame
        One row per thread with ``worker``, ``thread``, ``role`` and ``cpu``
        (:meth:`Mapping.to_frame`).
    title : str
    highlight : iterable of (worker, thread)
        Threads to ring (for instance those a constraint toggle moved).

    Returns
    -------
    plotly.graph_objects.Figure
        Traces ``cores`` (heatmap of the per-core load; one column per
        physical core, one row per SMT sibling), ``load`` (the load written
        in each cell), one ``worker w`` trace per worker (main threads as
        stars), and ``moved`` when ``highlight`` is not empty.
    """
    grid, highlight = grid.assign(x=_cell_x(grid)), list(highlight)
    n_cols, n_rows = int(grid["x"].max()) + 1, int(grid["sibling"].max()) + 1
    z = np.full((n_rows, n_cols), np.nan)
    hover = np.full((n_rows, n_cols), "", dtype=object)
    z[grid["sibling"].to_numpy(), grid["x"].to_numpy()] = grid["load"].to_numpy()
    for row in grid.itertuples(index=False):
        on = " ".join(row.threads) if row.threads else "-"
        hover[row.sibling, row.x] = (f"cpu {row.cpu} (core {row.physical_core}, SMT {row.sibling})<br>"
                                     f"{row.domain}<br>{row.load} threads (w.t): {on}"
                                     + ("<br>main thread here" if row.main else ""))
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        z=z, x=np.arange(n_cols), y=np.arange(n_rows), text=hover, hoverinfo="text", name="cores",
        colorscale=_LOAD_SCALE, zmin=0, zmax=max(2, float(grid["load"].max())), xgap=3, ygap=3,
        colorbar={"title": {"text": "threads"}, "thickness": 12, "len": 0.8}, showscale=True))
    fig.add_trace(go.Scatter(
        x=grid["x"], y=grid["sibling"] + 0.33, mode="text", text=grid["load"].astype(str), name="load",
        textfont={"size": 10, "color": "#444"}, hoverinfo="skip", showlegend=False))

    where = grid.set_index("cpu")[["x", "sibling", "load"]]
    pts = threads.join(where, on="cpu")
    pts["slot"] = pts.groupby("cpu").cumcount()
    offsets = [_thread_offsets(s, n) for s, n in zip(pts["slot"], pts["load"])]
    pts["px"] = pts["x"] + [dx for dx, _ in offsets]
    pts["py"] = pts["sibling"] + [dy for _, dy in offsets]
    for w, sel in pts.groupby("worker", sort=True):
        main = sel["role"].eq("main").to_numpy()
        fig.add_trace(go.Scatter(
            x=sel["px"], y=sel["py"], mode="markers", name=f"worker {w}",
            marker={"color": _WORKER_COLORS[int(w) % len(_WORKER_COLORS)],
                    "symbol": np.where(main, "star", "circle"), "size": np.where(main, 15, 9),
                    "line": {"color": "black", "width": np.where(main, 1.5, 0.5)}},
            customdata=np.c_[sel["thread"], sel["cpu"], sel["role"]],
            hovertemplate=f"worker {w}, thread %{{customdata[0]}} (%{{customdata[2]}})<br>"
                          "cpu %{customdata[1]}<extra></extra>"))
    if highlight:
        moved = pts.set_index(["worker", "thread"]).loc[highlight]
        fig.add_trace(go.Scatter(
            x=moved["px"], y=moved["py"], mode="markers", name="moved", hoverinfo="skip",
            marker={"symbol": "circle-open", "size": 20, "color": "crimson", "line": {"width": 2}}))

    shapes, notes = [], []
    for domain, sel in grid.groupby("domain", sort=False):
        x0, x1 = sel["x"].min() - 0.5, sel["x"].max() + 0.5
        shapes.append({"type": "rect", "x0": x0, "x1": x1, "y0": -0.5, "y1": n_rows - 0.5,
                       "line": {"color": "grey", "dash": "dot", "width": 1}, "layer": "below"})
        notes.append({"x": (x0 + x1) / 2, "y": n_rows - 0.45, "text": domain, "showarrow": False,
                      "yanchor": "bottom", "font": {"size": 11}})
    cores = grid.drop_duplicates("x")
    fig.update_layout(
        template=_TEMPLATE, title=title, shapes=shapes, annotations=notes, height=190 + 90 * n_rows,
        margin={"l": 50, "r": 20, "t": 60, "b": 40},
        legend={"orientation": "h", "yanchor": "top", "y": -0.15, "x": 0},
        xaxis={"title": "physical core", "tickmode": "array", "tickvals": cores["x"].tolist(),
               "ticktext": cores["physical_core"].astype(str).tolist(), "showgrid": False, "zeroline": False,
               "showticklabels": len(cores) <= _MAX_TICKS, "range": [-0.6, n_cols - 0.4]},
        yaxis={"title": "SMT", "tickmode": "array", "tickvals": list(range(n_rows)), "showgrid": False,
               "zeroline": False, "range": [-0.6, n_rows - 0.1]},
    )
    return fig


def distance_figure(distance, level, title="cache distance d(c, c')"):
    """Heatmap of the distance matrix; hover names the cache level each pair shares.

    Parameters
    ----------
    distance, level : pandas.DataFrame
        :attr:`DistanceView.distance` and :attr:`DistanceView.level`.
    """
    ids = [str(c) for c in distance.index]
    d = distance.to_numpy()
    # Costs span 1..200: a log scale keeps L1 and L2 apart from "same".
    z = np.log10(d)
    costs = sorted(set(np.unique(d).tolist()))
    names = {float(dist): lv for dist, lv in zip(d.ravel(), level.to_numpy().ravel())}
    fig = go.Figure(go.Heatmap(
        z=z, x=ids, y=ids, customdata=level.to_numpy(), colorscale="Viridis", reversescale=True,
        hovertemplate="cpu %{y} - cpu %{x}: %{customdata}<extra></extra>",
        colorbar={"title": {"text": "d"}, "tickvals": np.log10(costs).tolist(),
                  "ticktext": [f"{c:g} ({names.get(float(c), '')})" for c in costs]}))
    side = min(620, 260 + 8 * len(ids))
    fig.update_layout(template=_TEMPLATE, title=title, height=side, width=side + 140,
                      xaxis={"title": "cpu", "type": "category", "showticklabels": len(ids) <= 64},
                      yaxis={"title": "cpu", "type": "category", "autorange": "reversed",
                             "showticklabels": len(ids) <= 64},
                      margin={"l": 50, "r": 20, "t": 50, "b": 40})
    return fig


def pair_distance_figure(tables, title="cache distance between the threads of one worker"):
    """Heatmaps side by side, one per mode: ``d`` between each two threads of one worker, written in each cell.

    Parameters
    ----------
    tables : dict of str to pandas.DataFrame
        :meth:`ModeExplorer.pair_distances`: mode -> thread x thread distances.
    """
    from plotly.subplots import make_subplots

    modes = list(tables)
    top = max(float(t.to_numpy().max()) for t in tables.values()) or 1.0
    fig = make_subplots(rows=1, cols=len(modes), subplot_titles=[
        f"{m}: sum {tables[m].to_numpy()[np.triu_indices(len(tables[m]), 1)].sum():g}" for m in modes])
    for i, mode in enumerate(modes, start=1):
        t = tables[mode]
        labels = [str(c) for c in t.columns]
        fig.add_trace(go.Heatmap(z=t.to_numpy(), x=labels, y=labels, zmin=0, zmax=top, colorscale="Viridis",
                                 reversescale=True, showscale=i == 1, text=t.to_numpy(), texttemplate="%{text:g}",
                                 name=mode, hovertemplate="%{y} - %{x}: d = %{z:g}<extra></extra>"), row=1, col=i)
        fig.update_yaxes(autorange="reversed", type="category", row=1, col=i)
        fig.update_xaxes(type="category", row=1, col=i)
    fig.update_layout(template=_TEMPLATE, title=title, height=320, width=300 * len(modes) + 120,
                      margin={"l": 60, "r": 20, "t": 70, "b": 40})
    return fig


def tree_figure(nodes, edges, title="topology"):
    """The topology tree from :meth:`DistanceView.nodes` and :meth:`DistanceView.edges`, highlighted cpus in red."""
    pos = dict(zip(nodes["node"], zip(nodes["x"], nodes["y"])))
    ex, ey = [], []
    for a, b in edges:
        ex += [pos[a][0], pos[b][0], None]
        ey += [pos[a][1], pos[b][1], None]
    fig = go.Figure(go.Scatter(x=ex, y=ey, mode="lines", line={"color": "#bbb", "width": 1},
                               hoverinfo="skip", name="contains", showlegend=False))
    for kind, sel in nodes.groupby("kind", sort=False):
        fig.add_trace(go.Scatter(
            x=sel["x"], y=sel["y"], mode="markers", name=kind, marker={"size": 9 if kind == "pu" else 12},
            text=[f"{lab}: cpus {','.join(map(str, c))}" if len(c) <= 8 else f"{lab}: {len(c)} cpus"
                  for lab, c in zip(sel["label"], sel["cpus"])], hoverinfo="text"))
    hot = nodes[nodes["highlighted"]]
    fig.add_trace(go.Scatter(x=hot["x"], y=hot["y"], mode="markers", name="used by the mapping",
                             marker={"size": 14, "color": "crimson", "symbol": "circle-open", "line": {"width": 3}},
                             text=hot["label"], hoverinfo="text"))
    levels = nodes.drop_duplicates("y")
    fig.update_layout(template=_TEMPLATE, title=title, height=380, margin={"l": 70, "r": 20, "t": 50, "b": 30},
                      xaxis={"visible": False},
                      yaxis={"tickmode": "array", "tickvals": levels["y"].tolist(),
                             "ticktext": levels["kind"].tolist(), "showgrid": False, "zeroline": False})
    return fig


def loads_figure(frame, title="expected threads per logical core"):
    """Heatmap of :meth:`PolicyComparison.frame`: one row per policy, one column per logical core."""
    order = frame.drop_duplicates("cpu").sort_values(["column", "sibling"])["cpu"]
    table = frame.pivot(index="policy", columns="cpu", values="load").reindex(columns=order)
    table = table.reindex(list(dict.fromkeys(frame["policy"])))
    small = table.shape[1] <= 64
    fig = go.Figure(go.Heatmap(
        z=table.to_numpy(), x=[str(c) for c in table.columns], y=table.index.tolist(), colorscale="YlOrRd",
        zmin=0, texttemplate="%{z:.2~g}" if small else None, xgap=1, ygap=2,
        hovertemplate="%{y}: cpu %{x} expects %{z:.3g} threads<extra></extra>",
        colorbar={"title": {"text": "threads"}}))
    fig.update_layout(template=_TEMPLATE, title=title, height=140 + 45 * len(table),
                      xaxis={"title": "cpu (grouped by physical core)", "type": "category",
                             "showticklabels": small},
                      yaxis={"autorange": "reversed"}, margin={"l": 100, "r": 20, "t": 50, "b": 40})
    return fig


def p99_figure(results, title="p99 server time per trial"):
    """Per-trial p99 (ms) of :meth:`LiveExperiment.results`, one marker trace per policy."""
    fig = go.Figure()
    for policy, sel in results.groupby("policy", sort=False):
        fig.add_trace(go.Scatter(x=sel["trial"] + 1, y=sel["p99"] * 1e3, mode="markers+lines", name=policy,
                                 marker={"size": 9},
                                 hovertemplate=f"{policy}<br>trial %{{x}}: p99 %{{y:.1f}} ms<extra></extra>"))
    fig.update_layout(template=_TEMPLATE, title=title, height=320,
                      xaxis={"title": "trial", "dtick": 1, "rangemode": "tozero"},
                      yaxis={"title": "p99 (ms)", "rangemode": "tozero"}, margin={"l": 60, "r": 20, "t": 50, "b": 40})
    return fig


# -- still images -----------------------------------------------------------------------

def static(fig, width=None, height=None, scale=1):
    """A still PNG of a plotly figure, as an IPython display object a notebook stores.

    The interactive figure needs JavaScript that GitHub, the docs site and
    nbconvert do not run; the PNG is what they show. It is drawn by kaleido
    in a headless Chrome or Chromium (Debian's ``chromium`` package, or one
    that ``plotly_get_chrome`` downloads), offline: plotly.js comes from the
    plotly package. The same figure gives the same bytes, so re-running a
    notebook does not change its stored pictures.

    Parameters
    ----------
    fig : plotly.graph_objects.Figure, FigureWidget or dict
    width, height : int, optional
        Pixels; by default the figure's own layout size, else plotly's
        default (700 x 500).
    scale : float, default 1
        Pixel density (2 for a sharper, four times larger file).

    Returns
    -------
    IPython.display.Image
        A PNG (``.data`` holds its bytes).

    Raises
    ------
    RuntimeError
        kaleido is not installed or finds no Chrome/Chromium (plotly's
        message says how to get them).

    Examples
    --------
    >>> from tuna_lab.widgets import ModeExplorer
    >>> ex = ModeExplorer("xeon-8272cl", workers=4, threads=8)
    >>> # skipped: kaleido draws it in a headless Chromium, in seconds
    >>> still = static(mapping_figure(ex.grid(), ex.threads_frame()))     # doctest: +SKIP
    >>> still.format, len(still.data) > 10_000                            # doctest: +SKIP
    ('png', True)
    """
    from IPython.display import Image

    return Image(data=pio.to_image(fig, format="png", width=width, height=height, scale=scale), format="png")


class StaticRenderer(MimetypeRenderer):
    """A plotly renderer that adds :func:`static`'s PNG to the display of a figure.

    Combined with plotly's own ``plotly_mimetype`` renderer, a displayed
    figure is one output with two forms: JupyterLab, Notebook 7 and VS Code
    draw the interactive plotly JSON; GitHub, the docs site and nbconvert,
    which cannot, show the PNG. Where no PNG can be drawn (no kaleido, no
    Chrome) the figure is shown interactive only, with one warning that says
    why, so that a notebook never fails for want of a browser.

    Parameters
    ----------
    width, height, scale
        Passed to :func:`static`.

    Examples
    --------
    >>> import plotly.io as pio
    >>> # skipped: changes this kernel's plotly renderers
    >>> pio.renderers["tuna_lab_static"] = StaticRenderer()              # doctest: +SKIP
    >>> pio.renderers.default = "plotly_mimetype+tuna_lab_static"      # doctest: +SKIP
    """

    def __init__(self, width=None, height=None, scale=1):
        self.width, self.height, self.scale = width, height, scale

    def to_mimebundle(self, fig_dict):
        try:
            png = static(fig_dict, self.width, self.height, self.scale).data
        except RuntimeError as exc:
            warnings.warn(f"figure shown without a still image (GitHub and the docs will not show it): "
                          f"{one_line(exc)}", RuntimeWarning, stacklevel=2)
            return {}
        return {"image/png": base64.b64encode(png).decode("ascii")}
