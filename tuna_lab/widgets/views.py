"""Thin ipywidgets views over the controllers: forward events, redraw from state.

Every function returns a :class:`View` (an ``ipywidgets.VBox``) that keeps
its controller in ``.controller`` and its widgets in ``.parts``, so a
notebook can drive either and tests can click the buttons.

Examples
--------
>>> from tuna_lab.widgets import mode_explorer
>>> # skipped: needs ipywidgets and a notebook to show the view
>>> view = mode_explorer("xeon-8272cl", workers=4, threads=8)       # doctest: +SKIP
>>> view.parts["mode"].value = "compact"    # same as clicking          # doctest: +SKIP
>>> view.controller.mapping.f_mode < 0                                # doctest: +SKIP
True
"""

import html
from copy import deepcopy

import plotly.graph_objects as go

try:
    import ipywidgets as widgets
except ImportError:
    # The slim install (`make demo`, `pip install tuna_lab`) leaves the views' packages out; say so in one line.
    raise ImportError("tuna_lab's interactive views need ipywidgets: pip install 'tuna_lab[widgets]' (or "
                      "'tuna_lab[lab]' for JupyterLab too); the controllers (ModeExplorer, ...) work without it") from None

from ..model.instance import MODES
from .controllers import (TOPOLOGY_CHOICES, ConstraintToggles, DistanceView, LiveExperiment,
                          ModeExplorer, PolicyComparison)
from ..model.modes import EXAMPLE

__all__ = ["View", "mode_explorer", "distance_view", "constraint_toggles", "policy_comparison", "live_experiment"]


class View(widgets.VBox):
    """A VBox with its ``controller`` and its named ``parts`` (widgets and figures)."""

    def __init__(self, controller, parts, children, **kwargs):
        super().__init__(children=children, **kwargs)
        self.controller = controller
        self.parts = parts


def _redraw(widget, fig):
    """Replace a FigureWidget's traces and layout with those of ``fig`` in one message.

    plotly (>= 6, an anywidget) sends such edits only as one-off messages and keeps its
    synced state as it was built (empty) unless the figure itself is displayed; store the
    new figure there too, or a front end that connects later (Voila, a reloaded page) draws nothing.
    """
    with widget.batch_update():
        widget.data = ()
        widget.add_traces(fig.data)
        widget.layout = fig.layout
    widget._widget_layout, widget._widget_data = deepcopy(widget._layout_obj._props), deepcopy(widget._data)


def _status(error, text):
    if error:
        return f"<span style='color:#b00'>&#9888; {html.escape(error)}</span>"
    return f"<pre style='margin:0;line-height:1.3'>{html.escape(text)}</pre>"


def _topology_box(controller):
    # Free text: a preset, "this machine", a synthetic spec or hwloc XML pasted in.
    return widgets.Combobox(value=controller.topology.name.removeprefix("synthetic:"), options=TOPOLOGY_CHOICES,
                            ensure_option=False, continuous_update=False, description="topology",
                            placeholder="preset, this machine, synthetic spec or hwloc XML",
                            layout={"width": "420px"})


def _count_box(name, value):
    return widgets.BoundedIntText(value=value, min=1, max=4096, description=name, layout={"width": "170px"})


def _forward(widget, setter, current):
    """Call ``setter(new)`` when ``widget`` changes to something other than the state ``current()``."""
    def on_change(change):
        # Snapping a refused value back re-fires this handler; the state already holds it.
        if change["new"] != current():
            setter(change["new"])
    widget.observe(on_change, "value")


def mode_explorer(topology=EXAMPLE["topology"], workers=EXAMPLE["workers"], threads=EXAMPLE["threads"],
                  mode="scatter", physical=True, *, controller=None):
    """Explore the Tuna mapping: topology, workers, threads, a scatter/compact toggle and a physical-core one.

    Opens on an example where the two modes differ visibly; under the toggles, one line says what the
    toggle changes (or why nothing can change here, and what would), the objective terms of both modes
    side by side, one worker's thread distances in both modes, and the mapping with the threads the
    other mode moves ringed.

    Parameters
    ----------
    topology, workers, threads, mode, physical
        The :class:`~tuna_lab.widgets.ModeExplorer` to build (ignored if ``controller`` is given).
    controller : ModeExplorer, optional

    Returns
    -------
    View
        ``parts``: ``topology``, ``workers``, ``threads``, ``mode`` (ToggleButtons), ``physical``
        (Checkbox), ``difference`` (the one line), ``physical_effect``, ``terms`` (HTML table),
        ``status`` (objective terms or the error), ``distances`` and ``figure`` (FigureWidgets).
    """
    ctl = controller or ModeExplorer(topology, workers, threads, mode, physical)
    parts = {"topology": _topology_box(ctl), "workers": _count_box("workers", ctl.workers),
             "threads": _count_box("threads", ctl.threads),
             "mode": widgets.ToggleButtons(options=MODES, value=ctl.mode, description="mode",
                                           tooltips=("spread each worker's threads apart",
                                                     "pack each worker's threads together")),
             "physical": widgets.Checkbox(value=ctl.physical, indent=False,
                                          description="physical-core balance (8+), (11+-12+)"),
             "difference": widgets.HTML(), "physical_effect": widgets.HTML(), "terms": widgets.HTML(),
             "status": widgets.HTML(), "distances": go.FigureWidget(), "figure": go.FigureWidget()}
    parts["mode"].add_class("tuna-mode-toggle")     # a stable hook for the browser test (tests_ui/)

    def redraw(_=None):
        # Widgets show the accepted state: a refused value snaps back (the topology text stays, to fix it).
        parts["workers"].value, parts["threads"].value, parts["mode"].value = ctl.workers, ctl.threads, ctl.mode
        parts["physical"].value = ctl.physical
        parts["status"].value = _status(ctl.error, ctl.summary())
        colour = "#064" if ctl.differ() else "#a50"
        parts["difference"].value = f"<b style='color:{colour}'>{html.escape(ctl.difference())}</b>"
        parts["physical_effect"].value = f"<small>{html.escape(ctl.physical_effect())}</small>"
        parts["terms"].value = ctl.compare().to_html(float_format=lambda v: f"{v:+g}")
        _redraw(parts["distances"], ctl.distance_figure())
        _redraw(parts["figure"], ctl.figure())

    ctl.subscribe(redraw)
    _forward(parts["topology"], ctl.set_topology, lambda: None)
    _forward(parts["workers"], ctl.set_workers, lambda: ctl.workers)
    _forward(parts["threads"], ctl.set_threads, lambda: ctl.threads)
    _forward(parts["mode"], ctl.set_mode, lambda: ctl.mode)
    _forward(parts["physical"], ctl.set_physical, lambda: ctl.physical)
    redraw()
    controls = widgets.HBox([parts["topology"], parts["workers"], parts["threads"]])
    # The mode toggle stays a child of the view itself and the mapping its first figure: the browser
    # tests (tests_ui/explorer.py) find the explorer and its drawing so.
    return View(ctl, parts, [controls, parts["mode"], parts["physical"], parts["difference"],
                             parts["physical_effect"], parts["status"], parts["figure"],
                             widgets.HBox([parts["terms"], parts["distances"]])])


def distance_view(topology=None, *, explorer=None, controller=None):
    """The cache distance matrix and the topology tree, the mapping's cpus highlighted.

    Parameters
    ----------
    topology : Topology, str or None
    explorer : ModeExplorer, optional
        Follow this explorer: its topology, and its mapping's cpus highlighted.
    controller : DistanceView, optional

    Returns
    -------
    View
        ``parts``: ``status``, ``matrix`` and ``tree`` (FigureWidgets).
    """
    ctl = controller or DistanceView(explorer.topology if explorer else topology,
                                     explorer.mapping if explorer else ())
    parts = {"status": widgets.HTML(), "matrix": go.FigureWidget(), "tree": go.FigureWidget()}

    def redraw(_=None):
        parts["status"].value = _status(ctl.error, f"{ctl.topology.name}: {len(ctl.highlighted)} cpus highlighted")
        _redraw(parts["matrix"], ctl.figure("matrix"))
        _redraw(parts["tree"], ctl.figure("tree"))

    ctl.subscribe(redraw)
    if explorer is not None:
        # A refused change leaves the explorer's mapping as it was: nothing to redraw then.
        explorer.subscribe(lambda ex: ex.error is None and ctl.highlight(ex.mapping))
    redraw()
    return View(ctl, parts, [parts["status"], widgets.HBox([parts["matrix"], parts["tree"]])])


def constraint_toggles(workers=12, threads=6, topology="xeon-8272cl", mode="scatter", *, controller=None):
    """One checkbox per constraint family; the mapping re-solved without the unchecked ones.

    The default is a scenario-3 instance of the article's machine, where
    dropping (11)+(12) moves threads and breaks its check.

    Returns
    -------
    View
        ``parts``: ``checks`` (dict key -> Checkbox), ``status``, ``figure``
        (the mapping, moved threads ringed).
    """
    ctl = controller or ConstraintToggles(workers, threads, topology, mode)
    table = ctl.table()
    checks = {row.key: widgets.Checkbox(value=row.enabled, description=row.equations, indent=False,
                                        layout={"width": "110px"}) for row in table.itertuples()}
    rows = [widgets.HBox([checks[row.key], widgets.HTMLMath(
        f"{html.escape(row.description)} &nbsp; ${row.latex}$ <br><small><i>{html.escape(row.note)}</i></small>")])
        for row in table.itertuples()]
    parts = {"checks": checks, "status": widgets.HTML(), "figure": go.FigureWidget()}

    def redraw(_=None):
        for key, box in checks.items():
            box.value = ctl.enabled[key]
        dropped = [k for k, on in ctl.enabled.items() if not on]
        lines = [f"without: {', '.join(dropped) or 'nothing'}; {len(ctl.changed)} threads moved vs all families",
                 "violated checks: " + (", ".join(ctl.violated()) or "none")]
        lines += [f"  ({v.family}) {v.message}" for v in ctl.violations[:8]]
        parts["status"].value = _status(ctl.error, "\n".join(lines))
        _redraw(parts["figure"], ctl.figure())

    ctl.subscribe(redraw)
    for key, box in checks.items():
        _forward(box, lambda on, key=key: ctl.set_enabled(key, on), lambda key=key: ctl.enabled[key])
    redraw()
    return View(ctl, parts, [widgets.VBox(rows), parts["status"], parts["figure"]])


def policy_comparison(workers=4, threads=4, topology=None, policies=None, *, controller=None):
    """The placements of several policies side by side: expected load per core and a summary table.

    Returns
    -------
    View
        ``parts``: ``topology``, ``workers``, ``threads``, ``status``, ``figure``, ``table`` (HTML).
    """
    ctl = controller or PolicyComparison(workers, threads, topology, policies)
    parts = {"topology": _topology_box(ctl), "workers": _count_box("workers", ctl.workers),
             "threads": _count_box("threads", ctl.threads), "status": widgets.HTML(),
             "figure": go.FigureWidget(), "table": widgets.HTML()}

    def redraw(_=None):
        parts["workers"].value, parts["threads"].value = ctl.workers, ctl.threads
        parts["status"].value = _status(ctl.error, f"{ctl.topology.name}: W={ctl.workers} x T={ctl.threads}")
        _redraw(parts["figure"], ctl.figure())
        parts["table"].value = ctl.summary().to_html(float_format=lambda v: f"{v:.3g}", na_rep="-")

    ctl.subscribe(redraw)
    _forward(parts["topology"], ctl.set_topology, lambda: None)
    _forward(parts["workers"], ctl.set_workers, lambda: ctl.workers)
    _forward(parts["threads"], ctl.set_threads, lambda: ctl.threads)
    redraw()
    controls = widgets.HBox([parts["topology"], parts["workers"], parts["threads"]])
    return View(ctl, parts, [controls, parts["status"], parts["figure"], parts["table"]])


def live_experiment(workers=1, threads=1, model="small", batch=100, policies=("cfs", "round-robin", "tuna-scatter"),
                    trials=3, requests=100, *, controller=None):
    """Start/stop the pin-and-measure experiment and watch each trial's p99 arrive.

    Redraws run in the experiment's thread as results arrive.

    Returns
    -------
    View
        ``parts``: ``start``, ``stop`` (Buttons), ``status``, ``log`` (Textarea: the progress lines, then
        the run's summary table), ``figure``.
    """
    ctl = controller or LiveExperiment(workers, threads, model, batch, policies, trials, requests)
    parts = {"start": widgets.Button(description="start", icon="play", button_style="success"),
             "stop": widgets.Button(description="stop", icon="stop", button_style="warning", disabled=True),
             "status": widgets.HTML(), "figure": go.FigureWidget(),
             "log": widgets.Textarea(disabled=True, rows=8, layout={"width": "100%"})}
    c = ctl.config
    about = (f"W={c.workers} x T={c.threads}, model {c.model}, batch {c.batch}; {', '.join(ctl.policies)}; "
             f"{ctl.trials} trials x {ctl.requests} requests")

    def redraw(_=None):
        # From the state, not ``ctl.running``: the run's last notification comes from its own thread,
        # still alive then, and would leave start disabled after the run.
        busy = ctl.state in ("running", "stopping")
        parts["start"].disabled, parts["stop"].disabled = busy, not busy
        parts["status"].value = _status(ctl.error, f"{ctl.state}: {about}")
        # Once finished, the table `tuna-lab run` prints ends the log.
        summary = ctl.summary() if ctl.state == "finished" else None
        parts["log"].value = "\n".join(ctl.lines + ([summary.to_text()] if summary is not None else []))
        _redraw(parts["figure"], ctl.figure())

    ctl.subscribe(redraw)
    parts["start"].on_click(lambda _: ctl.start())
    # Never block the kernel on a click: the runner stops after the trial in flight.
    parts["stop"].on_click(lambda _: ctl.stop(wait=False))
    redraw()
    view = View(ctl, parts, [widgets.HBox([parts["start"], parts["stop"]]), parts["status"], parts["figure"],
                             parts["log"]])
    view.add_class("tuna-live-experiment")     # a stable hook for the browser test (tests_ui/)
    return view
