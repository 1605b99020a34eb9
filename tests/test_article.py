"""The article's design on a machine, and how a budget cuts it: pure functions, no server."""

import pytest
from hypothesis import given, settings

from strategies import article_budgets
from tuna_lab.errors import ExperimentError
from tuna_lab.measure.sweeps.article import ARTICLE, MARGIN, REQUESTS_FLOOR, TRIALS_MIN, article_design, estimate_cell
from tuna_lab.measure.experiment import grid

# The documented order of the cuts (docs/experiment.md, "Reproducing the article").
ORDER = ["requests", "batches", "models", "configurations", "trials", "requests", "estimate"]


def sides(pairs, cpus):
    return {w * t > cpus for w, t in pairs}


def in_order(whats):
    """Whether the cuts ``whats`` follow :data:`ORDER` (each step at most once, none out of turn)."""
    at = 0
    for what in whats:
        while at < len(ORDER) and ORDER[at] != what:
            at += 1
        if at == len(ORDER):
            return False
        at += 1
    return True


def work(design):
    """Requests the design sends, all cells, trials and policies together."""
    return len(design.configs) * design.trials * design.requests * len(design.policies)


def test_the_whole_design_on_the_articles_machine():
    d = article_design(cpus=32)
    assert sorted(d.pairs) == grid("article") and len(d.pairs) == 36
    assert d.pairs[:2] == ((4, 4), (16, 16))           # the stage cells first
    assert (d.models, d.batches, d.policies) == (ARTICLE["models"], ARTICLE["batches"], ARTICLE["policies"])
    assert (d.trials, d.requests, d.cuts) == (5, 1000, ())
    assert len(d.configs) == 324 and d.configs[0].model == "medium" and d.configs[0].batch == 100


def test_the_design_on_two_cpus_is_the_machine_grid():
    d = article_design(cpus=2)
    assert sorted(d.pairs) == grid("machine", cpus=2)
    assert d.stage_pairs == ((1, 1), (16, 1)) and d.pairs[:2] == d.stage_pairs
    assert sides(d.pairs, 2) == {True, False}


def test_explicit_options_are_never_cut():
    d = article_design(cpus=2, budget=60, models=["small"], batches=[500], requests=700, trials=5,
                       policies=["cfs", "tuna-scatter"])
    assert (d.models, d.batches, d.requests, d.trials, d.policies) == (("small",), (500,), 700, 5,
                                                                      ("cfs", "tuna-scatter"))
    assert [c.what for c in d.cuts] == ["configurations", "estimate"]      # only what was left free
    pairs = article_design(cpus=2, budget=60, pairs=[(2, 2), (4, 2)]).pairs
    assert sorted(pairs) == [(2, 2), (4, 2)]


def test_a_ten_minute_budget_on_two_cpus_cuts_in_the_documented_order():
    d = article_design(cpus=2, budget=600)
    assert [c.what for c in d.cuts] == ["requests", "batches", "models", "configurations"]
    assert d.requests == REQUESTS_FLOOR and d.models == ("medium",) and d.batches == (100,)
    assert d.pairs == ((1, 1), (16, 1)) and d.trials == 5 and d.estimate <= MARGIN * 600
    assert d.describe().startswith("budget 10m: requests 1000 -> 200; batches 500, 1000 cut; models small, large "
                                   "cut; configurations 9 -> 2 (kept 1x1, 16x1)")
    assert sum(estimate_cell(c, d.policies, d.trials, d.requests, 2) for c in d.configs) == pytest.approx(d.estimate)


@settings(max_examples=40, deadline=None)
@given(article_budgets())
def test_a_smaller_budget_never_yields_more_work(case):
    cpus, low, high = case
    small, large = article_design(cpus=cpus, budget=low), article_design(cpus=cpus, budget=high)
    assert work(small) <= work(large) and small.estimate <= large.estimate + 1e-6
    for d in (small, large):
        assert d.trials >= TRIALS_MIN and d.requests >= 100
        assert sides(d.pairs, cpus) == sides(grid("machine", cpus=cpus), cpus)      # both sides, when there are
        assert set(d.stage_pairs) <= set(d.pairs) and ("medium", 100) in {(c.model, c.batch) for c in d.configs}
        whats = [c.what for c in d.cuts]
        assert in_order(whats)
        assert d.estimate <= MARGIN * d.budget or whats[-1] == "estimate"


@pytest.mark.parametrize("bad", [{"budget": 0}, {"budget": -5}, {"cpus": 0}, {"trials": 0}, {"requests": -1}])
def test_bad_input_is_refused(bad):
    with pytest.raises(ExperimentError):
        article_design(**{"cpus": 2, **bad})
