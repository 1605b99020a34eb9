"""LitServe 0.2 serving XGBoost with ``workers_per_device=2`` on the CPU (apps/litserve), from ``.venv-field/litserve``.

Its master starts a multiprocessing Manager, uvicorn API-server processes that
answer HTTP and 2 inference worker processes fed over queues; the Manager, the
resource tracker and the API servers must never be taken for workers.
"""

import json

import fieldkit
import pytest
from fieldkit import APPS, FieldServer, framework_python, free_port, rows, train_model


@pytest.fixture(scope="module")
def server(tmp_path_factory, server_env):
    python = framework_python("litserve", ["litserve", "xgboost"])
    folder = tmp_path_factory.mktemp("litserve")
    model = train_model(python, folder / "model.json")
    body = folder / "predict.json"
    body.write_text(json.dumps({"rows": rows()}))
    port = free_port()
    srv = FieldServer([python, APPS / "litserve" / "server.py", model, port], server_env, folder, port,
                      f"http://127.0.0.1:{port}/predict", body, folder / "litserve.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def test_status_finds_the_two_inference_workers_and_says_what_the_helpers_are(server):
    fieldkit.check_status(server)


def test_pin_places_every_pool_as_the_plan_says(server):
    fieldkit.check_pin(server)


def test_unpin_restores_only_what_tuna_lab_set(server):
    fieldkit.check_unpin(server)


def test_run_measures_every_policy_and_gives_back_every_mask(server):
    fieldkit.check_run(server)


def test_run_gives_back_a_mask_the_user_set_with_taskset(server):
    fieldkit.check_run(server, user_mask=True)


def test_unpin_after_a_run_has_nothing_to_undo(server):
    fieldkit.check_unpin_after_run(server)
