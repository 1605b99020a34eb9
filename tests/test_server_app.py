"""The pattern-P WSGI app called directly, and the three cached XGBoost models.

Models are trained into a temporary ``TUNA_LAB_CACHE`` for this module, so
the user's cache is neither used nor polluted.
"""

import dataclasses
import http.client
import io
import json
import os
import subprocess
import sys
import threading
import time
import wsgiref.simple_server
import wsgiref.util
import wsgiref.validate

import numpy as np
import pytest

from tuna_lab.errors import ServerError, TunaError
from tuna_lab.server import models
from tuna_lab.server.app import app_from_env, create_app
from tuna_lab.server.models import STAGES
from tuna_lab.server.models import MODEL_FEATURES, ensure_model, load_booster, make_rows, model_path

MAX_BODY = 200_000   # a 100-row "small" payload is ~60 kB


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("tuna-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNA_LAB_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def small_model(cache):
    t0 = time.perf_counter()
    path = ensure_model("small")
    return path, time.perf_counter() - t0


@pytest.fixture(scope="module")
def app(small_model, tmp_path_factory):
    """One warm app serving "small" for the whole module: bad requests must not break it."""
    a = create_app("small", threads=2, max_body_bytes=MAX_BODY, request_log=tmp_path_factory.mktemp("log"))
    a.warm_up()
    return a


def call(app, method="GET", path="/healthz", body=None, content_length=True, environ=None, validate=True,
         content_type="application/json"):
    """Run one request through ``app`` (checked by wsgiref's validator); ``(status, headers, json)``.

    A POST says ``content_type`` (none when None), as every client of the lab server does.
    """
    env = {"REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": path, "QUERY_STRING": ""}
    wsgiref.util.setup_testing_defaults(env)
    body = b"" if body is None else body
    env["wsgi.input"] = io.BytesIO(body)
    if content_length:
        env["CONTENT_LENGTH"] = str(len(body))
    if method == "POST" and content_type is not None:
        env["CONTENT_TYPE"] = content_type
    env.update(environ or {})
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, dict(headers)

    result = (wsgiref.validate.validator(app) if validate else app)(env, start_response)
    try:
        data = b"".join(result)
    finally:
        getattr(result, "close", lambda: None)()
    assert seen["headers"]["Content-Type"] == "application/json"
    return int(seen["status"].split()[0]), seen["headers"], json.loads(data)


def payload(rows):
    return json.dumps({"rows": rows}).encode()


def good_body(batch=100, seed=0):
    return payload(make_rows("small", batch, seed).tolist())


def assert_serves(app):
    status, _, out = call(app, "POST", "/predict", good_body(7))
    assert status == 200 and out["count"] == 7


# -- models ------------------------------------------------------------------------------

def test_feature_counts_are_the_articles():
    assert MODEL_FEATURES == {"small": 29, "medium": 155, "large": 784}


@pytest.mark.parametrize("name", list(MODEL_FEATURES))
def test_make_rows_shape_and_determinism(name):
    X = make_rows(name, 100)
    assert X.shape == (100, MODEL_FEATURES[name]) and X.dtype == np.float32
    assert np.isfinite(X).all() and X.std() > 0
    np.testing.assert_array_equal(X, make_rows(name, 100))
    assert not np.array_equal(X, make_rows(name, 100, seed=1))
    assert make_rows(name, 1).shape == (1, MODEL_FEATURES[name])


def test_large_rows_look_like_mnist_pixels():
    X = make_rows("large", 50)
    assert X.min() == 0 and X.max() <= 255 and np.all(X == np.round(X))
    assert 0.3 < (X == 0).mean() < 0.95   # a mostly blank background, like digits


@pytest.mark.parametrize("call_", [lambda: model_path("huge"), lambda: make_rows("huge", 3),
                                   lambda: ensure_model("huge"), lambda: load_booster("huge", 1),
                                   lambda: create_app("huge")])
def test_unknown_model_names_the_valid_ones(call_):
    with pytest.raises(ServerError, match="unknown model 'huge'; choose from small, medium, large") as exc:
        call_()
    assert isinstance(exc.value, TunaError) and "\n" not in str(exc.value)


@pytest.mark.parametrize("batch", [0, -1, 2.5, True, "10"])
def test_make_rows_rejects_bad_batch(batch):
    with pytest.raises(ServerError, match="batch must be a positive integer"):
        make_rows("small", batch)


def test_small_trains_quickly_and_the_cache_is_reused(small_model, cache):
    path, seconds = small_model
    assert path.parent == cache and path.exists()
    assert "seed" in path.name and path.suffix == ".ubj"
    assert seconds < 30, f"training small took {seconds:.1f} s"
    mtime = path.stat().st_mtime_ns
    t0 = time.perf_counter()
    assert ensure_model("small") == path
    assert time.perf_counter() - t0 < 0.5 and path.stat().st_mtime_ns == mtime
    # atomic writes leave no temporary files behind
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]


def test_changing_the_recipe_changes_the_file_name(monkeypatch):
    before = model_path("small")
    monkeypatch.setitem(models._RECIPES, "small", dataclasses.replace(models._RECIPES["small"], max_depth=3))
    assert model_path("small") != before and not model_path("small").exists()


def test_medium_and_large_train_within_budget(cache):
    t0 = time.perf_counter()
    paths = {name: ensure_model(name) for name in ("medium", "large")}
    seconds = time.perf_counter() - t0
    assert seconds < 120, f"training medium + large took {seconds:.1f} s"
    sizes = [ensure_model(n).stat().st_size for n in ("small", "medium", "large")]
    assert sizes == sorted(sizes), "models should grow small < medium < large"
    for name, path in paths.items():
        booster = load_booster(name, 1)
        assert booster.num_features() == MODEL_FEATURES[name]


def test_load_booster_sets_nthread(small_model):
    booster = load_booster("small", 2)
    assert json.loads(booster.save_config())["learner"]["generic_param"]["nthread"] == "2"


def test_a_corrupt_cache_file_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(models._RECIPES, "small", dataclasses.replace(models._RECIPES["small"], seed=1))
    model_path("small").write_bytes(b"not a model")
    with pytest.raises(ServerError, match="cannot load model 'small' from"):
        load_booster("small", 1)


@pytest.mark.parametrize("nthread", [0, -2, 1.5, True])
def test_bad_thread_counts_are_refused(nthread):
    with pytest.raises(ServerError, match="nthread must be a positive integer"):
        load_booster("small", nthread)


# -- app: creation, health, warm-up ------------------------------------------------------

def test_importing_and_creating_the_app_loads_no_xgboost(cache):
    code = ("import sys; from tuna_lab.server.app import create_app, app_from_env; "
            "import tuna_lab.server.models; create_app('large', threads=4); app_from_env(); "
            "assert 'xgboost' not in sys.modules, 'xgboost imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_warm_up_returns_the_new_openmp_threads(small_model):
    # A fresh interpreter: in this one an earlier test may have built the pool already.
    code = ("import json, os; from tuna_lab.server.app import create_app; out = {}\n"
            "for t in (1, 2):\n"
            "    out[t] = create_app('small', threads=t).warm_up()\n"
            "out['live'] = sorted(int(t) for t in os.listdir('/proc/self/task'))\n"
            "print(json.dumps(out))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    threads = 2
    assert out["1"] == []                       # one thread: no pool at all
    assert len(out["2"]) >= threads - 1          # the pool's workers
    assert set(out["2"]) <= set(out["live"])


def test_healthz_is_503_until_mark_ready(small_model):
    a = create_app("small", threads=1)
    status, _, out = call(a, "GET", "/healthz")
    assert status == 503 and out["ready"] is False and out["pid"] == os.getpid() and out["reason"]
    assert a.ready is False
    a.mark_ready()
    status, _, out = call(a, "GET", "/healthz")
    assert status == 200 and out["status"] == "ok" and out["ready"] is True and out["pid"] == os.getpid()
    assert a._booster is None, "health checks must not load the model"


# -- app: predict -------------------------------------------------------------------------

def test_predict_times_the_five_stages(app):
    status, _, out = call(app, "POST", "/predict", good_body(100))
    assert status == 200
    assert out["count"] == 100 and out["pid"] == os.getpid()
    assert set(out["stages"]) == set(STAGES) and all(out["stages"][k] > 0 for k in STAGES)
    assert out["server_seconds"] >= sum(out["stages"].values())


def test_predict_loads_the_model_lazily_on_first_use(small_model):
    a = create_app("small", threads=1)
    assert a._booster is None
    status, _, out = call(a, "POST", "/predict", good_body(3))
    assert status == 200 and out["count"] == 3


def test_predict_accepts_integers_and_unterminated_length(app):
    rows = np.round(make_rows("small", 2)).astype(int).tolist()
    status, _, out = call(app, "POST", "/predict", payload(rows), content_length=False,
                          environ={"wsgi.input_terminated": True})
    assert status == 200 and out["count"] == 2


ROW = [0.5] * 29

BAD_BODIES = {
    "empty body": (b"", "empty body"),
    "whitespace body": (b"  \n", "empty body"),
    "malformed JSON": (b'{"rows": [[1, 2', "malformed JSON"),
    "not UTF-8": (b"\xff\xfe\xfa", "malformed JSON"),
    "missing rows": (b'{"data": [[1]]}', '"rows" key'),
    "not an object": (b"[[1, 2, 3]]", '"rows" key'),
    "rows not a list": (b'{"rows": 5}', "non-empty list"),
    "rows empty": (b'{"rows": []}', "non-empty list"),
    "row not a list": (payload([ROW, 3]), '"rows"[1] is not a list'),
    "ragged rows": (payload([ROW, ROW[:-1]]), "different lengths"),
    "wrong feature count": (payload([[1.0] * 30]), "expects 29 features per row, got 30"),
    "string value": (payload([ROW[:-1] + ["1.5"]]), "numbers only"),
    "null value": (payload([ROW[:-1] + [None]]), "numbers only"),
    "boolean value": (payload([ROW[:-1] + [True]]), "numbers only"),
    "nested value": (payload([ROW[:-1] + [[1.0]]]), "numbers only"),
    "NaN": (payload([ROW[:-1] + [float("nan")]]), "non-finite"),
    "Infinity": (payload([ROW[:-1] + [float("inf")]]), "non-finite"),
    "beyond float32": (payload([ROW[:-1] + [1e300]]), "non-finite"),
    "huge integer": (payload([ROW[:-1] + [10 ** 400]]), "numbers only"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_input_is_400_with_one_line_and_the_worker_keeps_serving(app, case):
    body, reason = BAD_BODIES[case]
    status, _, out = call(app, "POST", "/predict", body)
    assert status == 400
    assert set(out) == {"error"} and reason in out["error"]
    assert "\n" not in out["error"] and "Traceback" not in out["error"]
    assert_serves(app)


def test_invalid_content_length_is_400(app):
    # wsgiref's validator refuses such an environ; a lenient server might pass it on
    status, _, out = call(app, "POST", "/predict", good_body(2), environ={"CONTENT_LENGTH": "ten"}, validate=False)
    assert status == 400 and "Content-Length" in out["error"]
    assert_serves(app)


class _Unreadable(io.BytesIO):
    def read(self, *args):
        raise AssertionError("the body must not be read")


class _Broken(io.BytesIO):
    def read(self, *args):
        raise OSError("connection reset by peer")


def test_a_failing_input_stream_is_400(app):
    status, _, out = call(app, "POST", "/predict", environ={"CONTENT_LENGTH": "100", "wsgi.input": _Broken()})
    assert status == 400 and "could not read the request body: OSError: connection reset" in out["error"]
    assert_serves(app)


def test_declared_oversized_body_is_413_without_reading(app):
    status, _, out = call(app, "POST", "/predict", environ={"CONTENT_LENGTH": str(MAX_BODY + 1),
                                                            "wsgi.input": _Unreadable()})
    assert status == 413 and str(MAX_BODY) in out["error"]
    assert_serves(app)


def test_undeclared_oversized_body_is_413(app):
    body = good_body(100) + b" " * MAX_BODY
    status, _, out = call(app, "POST", "/predict", body, content_length=False,
                          environ={"wsgi.input_terminated": True})
    assert status == 413 and "exceeds" in out["error"]
    assert_serves(app)


def test_unknown_path_is_404_and_wrong_method_405_with_allow(app):
    status, _, out = call(app, "GET", "/nope")
    assert status == 404 and "/predict" in out["error"]
    status, headers, out = call(app, "GET", "/predict")
    assert status == 405 and headers["Allow"] == "POST"
    status, headers, out = call(app, "POST", "/healthz", b"{}")
    assert status == 405 and headers["Allow"] == "GET"
    assert_serves(app)


def test_unexpected_error_is_500_one_line_and_logged(app, caplog, monkeypatch):
    class Broken:
        def predict(self, dm, **kw):
            raise RuntimeError("boom\nwith a second line")

    monkeypatch.setattr(app, "_booster", Broken())
    status, _, out = call(app, "POST", "/predict", good_body(3))
    assert status == 500 and "RuntimeError: boom with a second line" in out["error"]
    assert "\n" not in out["error"]
    assert any("Traceback" in r.exc_text for r in caplog.records if r.exc_text)
    monkeypatch.undo()
    assert_serves(app)


def test_served_over_http_by_wsgiref(app):
    server = wsgiref.simple_server.make_server("127.0.0.1", 0, app, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
        conn.request("POST", "/predict", good_body(10), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["count"] == 10
        conn.close()
    finally:
        server.shutdown()
        server.server_close()


def test_too_many_rows_are_413_over_http_with_the_reason(small_model):
    limited = create_app("small", threads=1, max_rows=5)
    server = wsgiref.simple_server.make_server("127.0.0.1", 0, limited, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
        for rows, want in ((6, 413), (5, 200)):
            conn.request("POST", "/predict", good_body(rows), {"Content-Type": "application/json"})
            response = conn.getresponse()
            out = json.loads(response.read())
            assert response.status == want, out
        conn.request("POST", "/predict", good_body(6), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert "6 rows exceed the limit of 5 rows" in json.loads(response.read())["error"]
        conn.close()
    finally:
        server.shutdown()
        server.server_close()


def test_the_row_limit_defaults_from_the_models_width_and_is_read_from_the_environment():
    from tuna_lab.server.app import MAX_WORK, ROW_BUDGET_BYTES, max_rows
    from tuna_lab.server.models import model_cost

    assert max_rows("small", {}) > max_rows("medium", {}) > max_rows("large", {}) > 1000
    assert max_rows("large", {}) * 784 * 8 <= ROW_BUDGET_BYTES
    # The work bound is the smaller one for small and medium: what a measurement checks its batch against.
    for model in ("small", "medium", "large"):
        assert max_rows(model, {}) * model_cost(model) <= MAX_WORK
    assert max_rows("small", {"TUNA_LAB_MAX_WORK": str(10 * model_cost("small"))}) == 10
    assert app_from_env({"TUNA_LAB_MODEL": "small", "TUNA_LAB_MAX_ROWS": "7"}).max_rows == 7
    with pytest.raises(ServerError, match="TUNA_LAB_MAX_ROWS must be a positive integer"):
        app_from_env({"TUNA_LAB_MAX_ROWS": "-3"})


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *args):
        pass


def test_request_log_has_one_json_line_per_request(app):
    log = app.request_log / f"requests-{os.getpid()}.jsonl"
    before = len(log.read_text().splitlines()) if log.exists() else 0
    call(app, "POST", "/predict", good_body(5))
    call(app, "POST", "/predict", b"{")
    call(app, "GET", "/healthz")   # not an inference request: not logged
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == before + 2
    ok, bad = lines[-2:]
    assert ok["status"] == 200 and ok["batch"] == 5 and ok["pid"] == os.getpid()
    assert all(ok["stages"][k] > 0 for k in STAGES) and ok["server_seconds"] > 0
    assert bad["status"] == 400 and bad["batch"] is None and bad["stages"]["dmatrix"] is None
    assert {"time", "method", "path"} <= set(ok)


# -- app: what one client may take -----------------------------------------------------------

@pytest.mark.parametrize("content_type, ok", [("application/json", True), ("Application/JSON; charset=utf-8", True),
                                              (None, False), ("", False), ("text/plain", False),
                                              ("application/x-www-form-urlencoded", False),
                                              ("application/jsonp", False)])
def test_predict_takes_json_only_and_answers_415_with_the_reason(app, content_type, ok):
    status, _, out = call(app, "POST", "/predict", good_body(2), content_type=content_type)
    if ok:
        assert status == 200 and out["count"] == 2
    else:
        assert status == 415 and "application/json" in out["error"] and "\n" not in out["error"]
    assert_serves(app)


def test_more_work_than_the_bound_is_413_before_anything_is_predicted(small_model):
    from tuna_lab.server.models import model_cost

    bounded = create_app("small", threads=1, max_work=5 * model_cost("small"))
    status, _, out = call(bounded, "POST", "/predict", good_body(6))
    assert status == 413 and "exceed the work bound" in out["error"] and "send at most 5 rows" in out["error"]
    assert bounded._booster is None, "nothing may be loaded or predicted for a refused request"
    status, _, out = call(bounded, "POST", "/predict", good_body(5))
    assert status == 200 and out["count"] == 5
    assert app_from_env({"TUNA_LAB_MODEL": "small", "TUNA_LAB_MAX_WORK": "3840"}).max_work == 3840


class _TimedOut(io.BytesIO):
    def read(self, *args):
        raise TimeoutError("timed out")


def test_a_body_not_received_in_time_is_408(app):
    status, _, out = call(app, "POST", "/predict", environ={"CONTENT_LENGTH": "100", "wsgi.input": _TimedOut()})
    assert status == 408 and "not received within 5 s" in out["error"]
    assert_serves(app)


class _Taken:
    """What LabWorker puts in ``gunicorn.socket``: how long the request waited for a worker."""

    def __init__(self, waited):
        self.waited = waited


def test_past_the_queue_bound_predict_is_shed_with_503_and_retry_after(small_model):
    shedding = create_app("small", threads=1, max_wait=0.5)
    status, headers, out = call(shedding, "POST", "/predict", environ={"gunicorn.socket": _Taken(0.75),
                                                                       "wsgi.input": _Unreadable()})
    assert status == 503 and headers["Retry-After"] == "1" and "waited 0.75 s for a worker" in out["error"]
    assert call(shedding, "GET", "/healthz", environ={"gunicorn.socket": _Taken(9)})[0] == 503   # not ready yet
    shedding.mark_ready()
    assert call(shedding, "GET", "/healthz", environ={"gunicorn.socket": _Taken(9)})[0] == 200   # not shed
    for waited in (0.5, None):
        status, _, out = call(shedding, "POST", "/predict", good_body(2), environ={"gunicorn.socket": _Taken(waited)})
        assert status == 200, out
    # Without a bound nothing is shed, however long the wait.
    status, _, _ = call(create_app("small", threads=1), "POST", "/predict", good_body(2),
                        environ={"gunicorn.socket": _Taken(1e6)})
    assert status == 200


# -- construction --------------------------------------------------------------------------

def test_app_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNA_LAB_MODEL", "large")
    monkeypatch.setenv("TUNA_LAB_THREADS", "4")
    monkeypatch.setenv("TUNA_LAB_MAX_BODY", "1000")
    monkeypatch.setenv("TUNA_LAB_REQUEST_LOG", str(tmp_path / "logs"))
    a = app_from_env()
    assert (a.model, a.threads, a.n_features, a.max_body_bytes) == ("large", 4, 784, 1000)
    assert a.request_log == tmp_path / "logs" and a.request_log.is_dir()
    defaults = app_from_env({})
    assert (defaults.model, defaults.threads, defaults.request_log) == ("medium", 1, None)
    monkeypatch.setenv("TUNA_LAB_THREADS", "two")
    with pytest.raises(ServerError, match="TUNA_LAB_THREADS must be a positive integer, got 'two'"):
        app_from_env()


@pytest.mark.parametrize("kwargs, message", [({"threads": 0}, "threads must be a positive integer"),
                                             ({"threads": 1.5}, "threads must be a positive integer"),
                                             ({"max_body_bytes": -1}, "max_body_bytes must be"),
                                             ({"max_work": 0}, "max_work must be a positive integer"),
                                             ({"max_wait": -1}, "max_wait must be a positive"),
                                             ({"read_timeout": float("inf")}, "read_timeout must be a positive")])
def test_create_app_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ServerError, match=message):
        create_app("small", **kwargs)
