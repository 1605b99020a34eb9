"""MLServer 1.7 with its XGBoost runtime, ``parallel_workers: 2`` (apps/mlserver), from ``.venv-field/mlserver``.

Its master parses HTTP (and gRPC) itself and passes requests to 2 spawned
inference workers; a multiprocessing resource tracker is its only helper.
"""

import json
import shutil

import fieldkit
import pytest
from fieldkit import (
    APPS,
    FEATURES,
    FieldServer,
    framework_python,
    free_port,
    rows,
    train_model,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory, server_env):
    python = framework_python("mlserver", ["mlserver", "mlserver_xgboost"])
    folder = tmp_path_factory.mktemp("mlserver")
    models = folder / "xgb"                 # the folder MLServer scans; named as the model
    models.mkdir()
    for name in ("settings.json", "model-settings.json"):
        shutil.copy(APPS / "mlserver" / name, models)
    train_model(python, models / "model.json")
    batch = rows()
    body = folder / "infer.json"
    body.write_text(json.dumps({"inputs": [{"name": "predict", "shape": [len(batch), FEATURES],
                                            "datatype": "FP32", "data": batch}]}))
    port = free_port()
    env = dict(server_env, MLSERVER_HTTP_PORT=str(port), MLSERVER_GRPC_PORT=str(free_port()))
    srv = FieldServer([python.parent / "mlserver", "start", models], env, folder, port,
                      f"http://127.0.0.1:{port}/v2/models/xgb/infer", body, folder / "mlserver.log")
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
