"""The widgets: their controllers driven directly, the views built and clicked, a live run stopped."""

import glob
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tuna_lab import Topology
from tuna_lab.model.families import MainLoadCap
from tuna_lab.widgets import (compared_policies, ConstraintToggles, DistanceView, LiveExperiment, ModeExplorer,
                              PolicyComparison, topology_from)

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def xeon():
    return Topology.preset("xeon-8272cl")


def child_pids():
    """Children of every thread of this process (a runner thread's children are listed under its own task)."""
    pids = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            pids.update(int(p) for p in Path(path).read_text().split())
        except OSError:
            pass                                # that thread just ended
    return pids


# -- ModeExplorer -------------------------------------------------------------------

def test_mode_toggle_flips_the_sign_of_f_mode_and_moves_threads(xeon):
    ex = ModeExplorer(xeon, workers=4, threads=8)
    scatter = ex.mapping
    assert ex.mode == "scatter" and scatter.f_mode > 0
    assert ex.toggle_mode() and ex.error is None
    assert ex.mode == "compact" and ex.mapping.f_mode < 0
    assert not np.array_equal(scatter.assignment, ex.mapping.assignment)
    assert ex.toggle_mode() and np.array_equal(ex.mapping.assignment, scatter.assignment)


@pytest.mark.parametrize("spec", ["nonsense", "pack:2 core:x pu:2", "core:2", "<topology><object",
                                  "<html></html>", 42])
def test_bad_topology_sets_one_line_error_and_keeps_the_mapping(xeon, spec):
    ex = ModeExplorer(xeon, workers=2, threads=2)
    before = ex.mapping
    assert ex.set_topology(spec) is False
    assert ex.error and "\n" not in ex.error
    assert ex.mapping is before and ex.topology is xeon
    assert ex.set_workers(3) and ex.error is None          # a good change clears the error


def test_bad_counts_are_refused_without_raising(xeon):
    ex = ModeExplorer(xeon, workers=2, threads=2)
    for bad in (0, -1, "3", 2.5, True):
        assert ex.set_workers(bad) is False and ex.error and ex.workers == 2
    assert ex.set_mode("spread") is False and ex.mode == "scatter"


def test_every_kind_of_topology_input_is_read(xeon):
    xml = (DATA / "v2_linux_smt.xml").read_text()
    assert topology_from(xml).n_logical == 8
    assert topology_from(str(DATA / "v2_linux_smt.xml")).n_logical == 8
    assert topology_from("this machine").name == "this machine"
    assert topology_from("synthetic:pack:2 core:2 pu:1").n_logical == 4
    ex = ModeExplorer(xeon, 2, 2)
    assert ex.set_topology(xml) and ex.topology.n_logical == 8
    assert ex.set_topology("epyc-7313p") and ex.topology.name == "epyc-7313p"


def test_grid_has_one_row_per_logical_core_with_the_threads_on_it(xeon):
    ex = ModeExplorer(xeon, workers=4, threads=8)
    grid = ex.grid()
    assert grid["cpu"].tolist() == list(xeon.cpus)
    assert grid["load"].sum() == 32 and (grid["workers"].map(len) == grid["load"]).all()
    assert grid["mains"].sum() == 4 and set(grid.loc[grid["main"], "cpu"]) == set(ex.mapping.assignment[:, 0])
    assert grid["load"].tolist() == ex.mapping.logical_loads.tolist()
    # siblings x and x+16 share a column; one L3 domain on this machine
    assert grid.set_index("cpu").loc[[3, 19], "column"].nunique() == 1 and grid["domain"].nunique() == 1
    assert ex.table().shape == (4, 8) and "objective=" in ex.summary()


# -- DistanceView -----------------------------------------------------------------------

def test_distance_view_labels_levels_and_lays_out_a_tree():
    ex = ModeExplorer("epyc-7313p", workers=2, threads=2)
    dv = DistanceView("epyc-7313p", ex.mapping)
    assert dv.level.loc[0, 0] == "same" and dv.level.loc[0, 16] == "L1" and dv.level.loc[0, 4] == "none"
    assert dv.distance.loc[0, 1] == 50
    nodes = dv.nodes()
    assert len(nodes) == dv.graph.number_of_nodes()
    assert set(nodes.loc[nodes["highlighted"], "label"]) == {f"cpu {c}" for c in ex.mapping.assignment.ravel()}
    y = dict(zip(nodes["node"], nodes["y"]))
    assert all(y[parent] > y[child] for parent, child in dv.edges())
    assert dv.set_topology("bad spec") is False and dv.error and dv.topology.name == "epyc-7313p"


# -- ConstraintToggles -------------------------------------------------------------------

def test_dropping_11_12_on_scenario_3_reports_its_violation(xeon):
    ct = ConstraintToggles(12, 6, xeon)
    assert ct.mapping.instance.scenario3 and ct.violations == [] and ct.changed.empty
    assert ct.toggle("11-12") and ct.error is None and ct.enabled["11-12"] is False
    violated = bool(MainLoadCap().violations(ct.mapping.positions, ct.mapping.instance))
    assert ("11-12" in ct.violated()) == violated
    # On this instance the cap binds: without it main threads land on cores carrying U.
    assert violated and ct.violated() == ("11-12",) and len(ct.changed) > 0
    moved = ct.changed.iloc[0]
    assert ct.mapping.assignment[moved.worker, moved.thread] == moved.cpu != moved.reference_cpu
    assert ct.toggle("11-12") and ct.changed.empty and ct.violations == []


def test_refused_toggle_sets_error_and_changes_nothing(xeon):
    ct = ConstraintToggles(12, 6, xeon)
    before = ct.mapping
    assert ct.toggle("8") is False
    assert "(8)" in ct.error and ct.enabled["8"] is True and ct.mapping is before
    assert ct.set_enabled("99", False) is False and "unknown" in ct.error
    assert ct.table()["enabled"].all() and len(ct.table()) == len(ct.families)


def test_infeasible_toggle_is_refused(monkeypatch, xeon):
    from tuna_lab.errors import InfeasibleModelError
    from tuna_lab.model import TunaModel

    ct = ConstraintToggles(4, 4, xeon)

    def infeasible(self, **_):
        raise InfeasibleModelError("no mapping satisfies the families", ["8"])

    monkeypatch.setattr(TunaModel, "solve", infeasible)
    assert ct.toggle("3") is False and ct.error.startswith("no mapping") and ct.enabled["3"]


# -- PolicyComparison -----------------------------------------------------------------

def test_policy_comparison_has_one_placement_per_policy_with_all_threads(xeon):
    pc = PolicyComparison(4, 8, xeon)
    assert list(pc.placements) == list(compared_policies()) == list(pc.loads.columns)
    assert np.allclose(pc.loads.sum(), 32)
    assert pc.loads["tuna-scatter"].tolist() == pc.placements["tuna-scatter"].mapping.logical_loads.tolist()
    assert set(pc.frame()["policy"]) == set(compared_policies()) and list(pc.summary().index) == list(compared_policies())
    assert pc.set_threads(0) is False and pc.error and pc.threads == 8
    assert pc.set_workers(2) and np.allclose(pc.loads.sum(), 16)


# -- LiveExperiment -----------------------------------------------------------------------

def test_live_experiment_collects_trial_rows():
    before = child_pids()
    seen = []
    live = LiveExperiment(1, 1, "small", batch=20, policies=["cfs"], trials=1, requests=20)
    live.subscribe(lambda ctl: seen.append(len(ctl.results())))
    assert live.start()
    assert live.wait(timeout=180), "the run did not end"
    assert live.state == "finished" and live.error is None, live.error
    rows = live.results()
    assert rows[["trial", "policy"]].values.tolist() == [[0, "cfs"]]
    assert rows["p99"].iloc[0] > 0 and rows["trial_status"].iloc[0] == "ok"
    assert 1 in seen and live.lines
    # The same table `tuna-lab run` prints, from the library.
    assert live.summary().summary[["policy", "trials"]].values.tolist() == [["cfs", 1]]
    assert child_pids() <= before


def test_live_experiment_stops_between_trials_and_leaves_no_server():
    before = child_pids()
    live = LiveExperiment(1, 1, "small", batch=20, policies=["cfs", "round-robin", "tuna-scatter"], trials=1,
                          requests=20)
    assert live.start() and live.running()
    assert live.start() is False and "already running" in live.error
    live.stop(wait=False)
    assert live.state == "stopping"
    assert live.wait(timeout=180), "the run did not stop"
    assert live.state == "stopped" and len(live.results()) == 1      # only the trial in flight finished
    assert live.lines[-1].startswith("stopped after 1 of 3")
    assert child_pids() <= before


def test_live_experiment_refuses_bad_settings():
    from tuna_lab.errors import ExperimentError
    from tuna_lab.errors import ModelError

    with pytest.raises(ExperimentError):
        LiveExperiment(1, 1, policies=["nope"])
    with pytest.raises(ModelError):
        LiveExperiment(1, 1, trials=0)


# -- views -----------------------------------------------------------------------------

def test_views_build_and_the_mode_toggle_redraws_the_mapping():
    widgets = pytest.importorskip("ipywidgets")
    import plotly.graph_objects as go

    from tuna_lab.widgets import (constraint_toggles, distance_view, live_experiment, mode_explorer,
                                  policy_comparison)

    view = mode_explorer("xeon-8272cl", workers=4, threads=8)
    assert isinstance(view, widgets.Box) and isinstance(view.parts["figure"], go.FigureWidget)
    before = [(t.name, tuple(t.x)) for t in view.parts["figure"].data if t.name.startswith("worker")]
    view.parts["mode"].value = "compact"                      # what a click on "compact" does
    after = [(t.name, tuple(t.x)) for t in view.parts["figure"].data if t.name.startswith("worker")]
    assert view.controller.mode == "compact" and view.controller.mapping.f_mode < 0
    assert before != after and "compact" in view.parts["figure"].layout.title.text
    view.parts["workers"].value = 2
    assert view.controller.workers == 2 and len([t for t in view.parts["figure"].data
                                                 if t.name.startswith("worker")]) == 2
    view.parts["topology"].value = "nonsense"
    assert "unknown topology" in view.parts["status"].value and view.controller.topology.name == "xeon-8272cl"

    follower = distance_view(explorer=view.controller)
    assert follower.controller.highlighted == set(view.controller.mapping.assignment.ravel().tolist())

    toggles = constraint_toggles(12, 6, "xeon-8272cl")
    toggles.parts["checks"]["8"].value = False                # refused: (11-12) needs (8)
    assert toggles.parts["checks"]["8"].value is True and "needs (8)" in toggles.parts["status"].value
    toggles.parts["checks"]["11-12"].value = False
    assert "moved" in [t.name for t in toggles.parts["figure"].data]

    for built in (follower, toggles, policy_comparison(4, 4, "xeon-8272cl"), live_experiment()):
        assert isinstance(built, widgets.Box) and built.controller is not None


def test_a_front_end_that_connects_later_draws_the_current_figure():
    # plotly's FigureWidget sends edits as one-off messages; Voila or a reloaded page reads the synced state.
    pytest.importorskip("ipywidgets")
    from tuna_lab.widgets import mode_explorer

    view = mode_explorer("xeon-8272cl", workers=4, threads=8)
    figure = view.parts["figure"]
    for mode in ("scatter", "compact"):
        view.parts["mode"].value = mode
        state = figure.get_state()
        assert [t.get("name") for t in state["_widget_data"]] == [t.name for t in figure.data]
        assert state["_widget_layout"]["title"]["text"].endswith(mode)


def test_importing_the_package_does_not_need_ipywidgets():
    code = ("import sys; sys.modules['ipywidgets'] = None\n"
            "import tuna_lab.widgets as w\n"
            "assert w.ModeExplorer and 'tuna_lab.widgets.views' not in sys.modules\n"
            "try:\n    w.mode_explorer\nexcept ImportError:\n    print('lazy')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "lazy", out.stderr


def test_distance_view_names_the_remote_numa_level():
    from tuna_lab.machine.topology import Topology
    from tuna_lab.widgets import DistanceView

    topo = Topology.synthetic("numa:2 l3:1 core:2 pu:1")
    assert "remote" not in set(DistanceView(topo).level.values.ravel())
    level = DistanceView(topo.with_costs({"remote": 420})).level.to_numpy()
    assert level[0, 2] == "remote" and level[0, 1] == "L3" and level[3, 3] == "same"


# -- still images --------------------------------------------------------------------------

def _png_size(png):
    """(width, height) from a PNG's header."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", png[:8]
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


@pytest.fixture(scope="module")
def chrome():
    """Skip unless kaleido can draw here (it needs a Chrome/Chromium: Debian's chromium package)."""
    import plotly.graph_objects as go
    import plotly.io as pio

    try:
        pio.to_image(go.Figure(), format="png", width=20, height=20)
    except RuntimeError as exc:
        pytest.skip(f"no still images here: {exc}")


def test_static_draws_the_figure_as_a_png_of_its_own_size(xeon, chrome):
    from tuna_lab.widgets.figures import mapping_figure, static

    ex = ModeExplorer(xeon, workers=4, threads=8)
    scatter = mapping_figure(ex.grid(), ex.threads_frame(), "scatter")
    still = static(scatter)
    assert still.format == "png"
    assert _png_size(still.data) == (700, scatter.layout.height)        # plotly's default width
    assert _png_size(static(scatter, width=500, height=300, scale=2).data) == (1000, 600)
    # The same figure gives the same bytes (re-running a notebook changes nothing); another one does not.
    assert static(scatter).data == still.data
    ex.toggle_mode()
    assert static(mapping_figure(ex.grid(), ex.threads_frame(), "scatter")).data != still.data


def test_static_renderer_adds_the_png_or_warns_once_without_it(monkeypatch):
    import base64

    from IPython.display import Image

    from tuna_lab.widgets import figures

    seen = []
    monkeypatch.setattr(figures, "static", lambda fig, *a: seen.append(fig) or Image(data=b"\x89PNG fake",
                                                                                        format="png"))
    fig = {"data": [], "layout": {}}
    bundle = figures.StaticRenderer().to_mimebundle(fig)
    assert seen == [fig] and base64.b64decode(bundle["image/png"]) == b"\x89PNG fake"

    def no_browser(*_):
        raise RuntimeError("Kaleido requires Google Chrome to be installed.\nInstall it by running ...")

    monkeypatch.setattr(figures, "static", no_browser)
    with pytest.warns(RuntimeWarning, match="without a still image .* Kaleido requires Google Chrome"):
        assert figures.StaticRenderer().to_mimebundle(fig) == {}


def test_live_view_plots_each_trial_and_offers_start_again_when_the_run_ends():
    pytest.importorskip("ipywidgets")
    from tuna_lab.widgets import live_experiment

    before = child_pids()
    view = live_experiment(controller=LiveExperiment(1, 1, "small", batch=20, policies=["cfs"], trials=1,
                                                     requests=20))
    assert not view.parts["start"].disabled and view.parts["stop"].disabled
    view.parts["start"].click()
    assert view.parts["start"].disabled and not view.parts["stop"].disabled
    assert view.controller.wait(timeout=180), "the run did not end"
    assert view.controller.state == "finished", view.controller.error
    # The run's last redraw comes from its own thread: start must be offered again all the same.
    assert not view.parts["start"].disabled and view.parts["stop"].disabled
    assert [len(t.y) for t in view.parts["figure"].data] == [1] and "finished:" in view.parts["status"].value
    assert "p99 speedup vs cfs" in view.parts["log"].value       # the summary table ends the log
    assert child_pids() <= before


# -- one rule for every controller's members -------------------------------------------------

def test_assigning_an_input_takes_effect_or_raises_what_refused_it(xeon):
    from tuna_lab.errors import ModelError, TopologyError

    ex = ModeExplorer(xeon, workers=4, threads=4)
    ex.workers = 5                                            # the case: the mapping kept 4 workers
    assert ex.workers == 5 and ex.mapping.workers == 5 and ex.mapping.assignment.shape == (5, 4)
    ex.mode = "compact"
    assert ex.mapping.mode == "compact" and ex.mapping.f_mode < 0
    with pytest.raises(ModelError, match="workers must be a positive integer"):
        ex.workers = 0
    assert ex.workers == 5 and ex.mapping.workers == 5 and "positive integer" in ex.error
    with pytest.raises(TopologyError):
        ex.topology = "nonsense"
    assert ex.topology is xeon
    pc = PolicyComparison(4, 4, xeon, ["round-robin", "tuna-scatter"])
    pc.threads = 2
    assert np.allclose(pc.loads.sum(), 8)
    pc.policies = ["omp-close"]
    assert list(pc.loads.columns) == ["omp-close"] and list(pc.summary().index) == ["omp-close"]
    dv = DistanceView("epyc-7313p")
    dv.highlighted = [0, 1, 99]
    assert dv.highlighted == {0, 1}


def test_computed_state_is_read_only_and_says_what_to_change(xeon):
    ex = ModeExplorer(xeon, workers=2, threads=2)
    with pytest.raises(AttributeError, match=r"ModeExplorer.mapping is read-only: assign one of its inputs"):
        ex.mapping = None
    ct = ConstraintToggles(4, 4, xeon)
    with pytest.raises(AttributeError, match=r"ConstraintToggles.workers is read-only: set_enabled\(\)"):
        ct.workers = 5
    with pytest.raises(TypeError):
        ct.enabled["8"] = False                               # a toggle goes through set_enabled, which re-solves
    assert ct.enabled["8"] is True and ct.mapping.workers == 4
    live = LiveExperiment(1, 1, policies=["cfs"], trials=1, requests=20)
    with pytest.raises(AttributeError, match="LiveExperiment.trials is read-only"):
        live.trials = 5
    assert live.trials == 1


@pytest.mark.parametrize("cls", [ModeExplorer, DistanceView, ConstraintToggles, PolicyComparison, LiveExperiment])
def test_no_controller_member_is_a_property(cls):
    # Worked out on request = a method (grid(), violated(), results() ...), held = an attribute: a reader
    # never has to guess whether to call it (ct.violated() raised TypeError while it was a property).
    props = [name for klass in cls.__mro__ for name, member in vars(klass).items() if isinstance(member, property)]
    assert props == []


def test_violated_is_a_method_like_the_other_computed_members(xeon):
    ct = ConstraintToggles(12, 6, xeon)
    assert ct.violated() == () and ct.toggle("(11)") and ct.violated() == ("11-12",)
    assert ct.toggle("MainLoadCap") and ct.enabled["11-12"]       # the one resolver: key, equation, class name


def test_controllers_have_readable_reprs_and_figures(xeon):
    ex = ModeExplorer(xeon, workers=2, threads=2)
    assert repr(ex).startswith("ModeExplorer(topology='xeon-8272cl', workers=2, threads=2, mode='scatter', "
                               "physical=True, f_mode=")
    ex.set_workers(0)
    assert "error='workers must be a positive integer, got 0'" in repr(ex)
    ct = ConstraintToggles(4, 4, xeon)
    assert repr(ct) == ("ConstraintToggles(workers=4, threads=4, topology='xeon-8272cl', mode='scatter', without=[], "
                        "violated=[], moved=0)")
    dv = DistanceView("epyc-7313p", [0])
    assert repr(dv) == "DistanceView(topology='epyc-7313p', highlighted=[0], levels=['L1', 'L3', 'none'])"
    assert repr(PolicyComparison(2, 2, xeon, ["omp-close"])) == (
        "PolicyComparison(topology='xeon-8272cl', workers=2, threads=2, policies=('omp-close',))")
    assert "<" not in repr(LiveExperiment(1, 1, policies=["cfs"], trials=1, requests=20))
    assert repr(ex.mapping).startswith("Mapping(W=2, T=2, scatter, topology='xeon-8272cl'")
    assert [t.type for t in dv.figure().data] == ["heatmap"] and dv.figure("tree").data
    with pytest.raises(ValueError, match="kind must be"):
        dv.figure("pie")
    assert ct.figure().data and ex.figure().data and PolicyComparison(2, 2, xeon, ["omp-close"]).figure().data


# -- the audit of issue 49: setters refuse what they cannot take; outputs stay the controller's ----------

@pytest.mark.parametrize("bad", [None, 5, "abc", [1.5], [True], b"\x01"])
def test_highlight_takes_cpu_ids_or_a_mapping_and_refuses_the_rest(bad):
    from tuna_lab.errors import ModelError

    dv = DistanceView("epyc-7313p", [0])
    # before: TypeError for None and 5, "invalid literal for int()" for "abc", and [1.5] highlighted cpu 1
    assert dv.highlight(bad) is False and dv.highlighted == {0}
    assert dv.error.startswith("highlighted: cpu ids (ints) or a Mapping, got ")
    with pytest.raises(ModelError, match=r"highlighted: cpu ids \(ints\) or a Mapping"):
        dv.highlighted = bad
    assert dv.highlighted == {0}
    assert dv.highlight(np.array([1, 2])) and dv.highlighted == {1, 2} and dv.error is None
    assert dv.highlight(ModeExplorer("epyc-7313p", 1, 2).mapping) and len(dv.highlighted) == 2


def test_policies_are_refused_unless_they_are_names(xeon):
    pc = PolicyComparison(2, 2, xeon, ["omp-close"])
    # before: set_policies(5) raised TypeError ('int' object is not iterable)
    for bad in (5, [5], b"numa"):
        assert pc.set_policies(bad) is False and pc.error.startswith("policies: policy names (str), got")
    assert pc.policies == ("omp-close",) and list(pc.loads.columns) == ["omp-close"]
    assert pc.set_policies("numa") and pc.policies == ("numa",)


@pytest.mark.parametrize("make", [lambda: ModeExplorer("xeon-8272cl", 2, 2),
                                  lambda: ConstraintToggles(2, 2, "xeon-8272cl"),
                                  lambda: PolicyComparison(2, 2, "xeon-8272cl", ["omp-close"])],
                         ids=["ModeExplorer", "ConstraintToggles", "PolicyComparison"])
def test_time_limit_is_an_input_checked_when_it_is_given(make):
    from tuna_lab.errors import ModelError

    ctl = make()
    # before: "x" was stored, and the next set_workers refused with a message about the time limit
    with pytest.raises(ModelError, match="time_limit must be a positive finite number, got 'x'"):
        ctl.time_limit = "x"
    assert ctl.time_limit == 10.0 and ctl.set_time_limit(0) is False and "got 0" in ctl.error
    ctl.time_limit = 3
    assert ctl.time_limit == 3.0 and ctl.error is None and "time_limit" not in repr(ctl)
    if isinstance(ctl, ConstraintToggles):
        assert ctl.set_enabled("11-12", False) and ctl.error is None
    else:
        assert ctl.set_workers(3) and ctl.error is None
    args = ("xeon-8272cl", 2, 2) if isinstance(ctl, ModeExplorer) else (2, 2, "xeon-8272cl")
    with pytest.raises(ModelError, match="time_limit must be a positive finite number, got None"):
        type(ctl)(*args, time_limit=None)


def test_error_and_a_runs_progress_are_outputs_a_user_cannot_assign(xeon):
    ex = ModeExplorer(xeon, workers=2, threads=2)
    assert ex.set_workers(0) is False
    # before: ex.error = "x" was accepted, and a view showed a refusal nobody made
    with pytest.raises(AttributeError, match="ModeExplorer.error is read-only: it says why the controller refused"):
        ex.error = None
    assert "positive integer" in ex.error
    live = LiveExperiment(1, 1, policies=["cfs"], trials=1, requests=20)
    # before: live.state = "running" said a run was on with nothing running, and lines took any list
    for name, value in (("state", "running"), ("lines", ["x"]), ("result", None), ("error", "x")):
        with pytest.raises(AttributeError, match=f"LiveExperiment.{name} is read-only"):
            setattr(live, name, value)
    assert live.state == "idle" and live.lines == [] and live.error is None and not live.running()


@pytest.mark.parametrize("family, on", [("8", "yes"), ("11-12", None), ("11-12", 0), ("11-12", "False")])
def test_a_toggle_takes_true_or_false(xeon, family, on):
    ct = ConstraintToggles(4, 4, xeon)
    # before: "yes" was read as True and None as False (bool(on)): ("11-12", None) dropped the family
    assert ct.set_enabled(family, on) is False
    assert ct.error == f"on must be True or False, got {on!r}" and all(ct.enabled.values())
    assert ct.set_enabled("11-12", np.bool_(False)) and not ct.enabled["11-12"]
