"""One registered name per brought model (io/brought_models.py), on a real MLflow registry in SQLite: the same
weights brought by another spelling register to the name they hold; `reevaluate --model SPELLING` finds it."""

from __future__ import annotations

import pytest

from ttt_pipeline.config import load_config
from ttt_pipeline.io.brought_models import name_for, registered_name, tag_version, watched_name

LABELS = ["negative", "positive"]
TASK = "ttt-demo-reviews-negative-positive"


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory):
    """An MLflow database with its tables made once (the migrations take seconds); each test gets a copy."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("registry") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_registered_models()
    return db


@pytest.fixture()
def client(empty_db, tmp_path):
    import shutil

    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{shutil.copy(empty_db, tmp_path / 'mlflow.db')}")


def register(client, name: str, digest: str, source: str) -> dict:
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    mv = client.create_model_version(name, "file:///nowhere")
    registry = {"model_name": name, "version": str(mv.version)}
    tag_version(client, registry, digest, source)
    return registry


def brought(model: str, *sets: str):
    cfg = load_config("demo", list(sets))
    cfg.model.classifier = model
    return cfg


def test_weights_registered_before_go_to_that_name_whatever_the_spelling(client):
    folder = brought("/home/me/hf-classifier")
    assert registered_name(client, folder, LABELS, "d1").registry.model_name == f"{TASK}-hf-classifier"
    register(client, f"{TASK}-hf-classifier", "d1", "/home/me/hf-classifier")
    uri = brought("models:/my-classifier@prod")
    assert registered_name(client, uri, LABELS, "d1").registry.model_name == f"{TASK}-hf-classifier"
    assert registered_name(client, uri, LABELS, "other-weights").registry.model_name == f"{TASK}-my-classifier"
    assert uri.registry.model_name is None  # a copy is named, not the caller's configuration


def test_the_nightly_watches_the_name_a_spelling_was_registered_under(client):
    register(client, f"{TASK}-hf-classifier", "d1", "/home/me/hf-classifier")
    register(client, f"{TASK}-hf-classifier", "d1", "models:/my-classifier@prod")
    assert watched_name(client, brought("models:/my-classifier@prod"), LABELS) == f"{TASK}-hf-classifier"
    assert watched_name(client, brought("models:/never-brought@prod"), LABELS) == f"{TASK}-never-brought"
    assert watched_name(client, load_config("demo"), LABELS) == TASK  # a pipeline-trained champion


def test_an_explicit_name_or_another_task_is_never_borrowed(client):
    register(client, "team-model", "d1", "/home/me/hf-classifier")
    register(client, "ttt-rt-polarity-negative-positive-hf-classifier", "d2", "/home/me/hf-classifier")
    own = brought("/home/me/other", "registry.model_name=mine")
    assert registered_name(client, own, LABELS, "d1").registry.model_name == "mine"
    assert watched_name(client, own, LABELS) == "mine"
    # d1 is held by a name outside this task, d2 by another task: neither is this task's name
    for digest in ("d1", "d2"):
        assert name_for(client, f"{TASK}-other", TASK, digest=digest) == f"{TASK}-other"


def test_the_oldest_holder_wins_and_a_quote_keeps_its_own_name(client):
    register(client, f"{TASK}-first", "d1", "/a")
    register(client, f"{TASK}-second", "d1", "/b")
    assert name_for(client, f"{TASK}-third", TASK, digest="d1") == f"{TASK}-first"
    assert name_for(client, f"{TASK}-x", TASK, source="/it's") == f"{TASK}-x"
