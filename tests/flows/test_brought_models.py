"""One registered name per brought model (io/brought_models.py), on a real MLflow registry in SQLite: the same
weights brought by another spelling register to the name they hold; `reevaluate --model SPELLING` finds it, and
judges the version registered from the files the spelling names now (a user's alias that moved)."""

from __future__ import annotations

import pytest

from ttt_pipeline.config import load_config
from ttt_pipeline.errors import NoChampion
from ttt_pipeline.io.brought_models import (
    current_files,
    imported_files,
    name_for,
    registered_name,
    tag_version,
    version_of_files,
    watched_name,
)

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


def register(client, name: str, digest: str, source: str, files: str | None = None) -> dict:
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    mv = client.create_model_version(name, "file:///nowhere")
    registry = {"model_name": name, "version": str(mv.version)}
    tag_version(client, registry, digest, source, files)
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


def test_the_nightly_follows_the_files_a_spelling_names_now(client):
    """prod's v1 evaluated and champion; the alias moves to v2's files: not judged yet (NoChampion naming the
    versions); once v2's files are evaluated (registered as v3, not the champion) the night judges v3; the same
    weights brought by another spelling (v2's) keep the champion judged."""
    name, prod = f"{TASK}-my-classifier", "models:/my-classifier@prod"
    register(client, name, "w1", prod, files="f1")
    register(client, name, "w1", "/home/me/hf-classifier", files="f1-folder")
    client.set_registered_model_alias(name, "champion", "1")
    assert version_of_files(client, name, "f1", prod).version == 1
    assert version_of_files(client, name, "f1-folder", "/home/me/hf-classifier").version == 1  # same weights
    with pytest.raises(NoChampion) as err:
        version_of_files(client, name, "f2", prod)
    assert "(v1, v2)" in err.value.message and f"new version of {name}" in err.value.hint
    register(client, name, "w2", prod, files="f2")
    judged = version_of_files(client, name, "f2", prod)
    assert judged.version == 3 and judged.aliases == []  # the champion alias stayed on v1
    client.set_registered_model_alias(name, "champion", "3")
    register(client, name, "w2", prod, files="f2")  # registered again: the champion among equals is judged
    assert version_of_files(client, name, "f2", prod).version == 3


def test_versions_registered_before_files_were_kept_judge_the_champion(client):
    register(client, f"{TASK}-old", "w1", "models:/old@prod")
    assert version_of_files(client, f"{TASK}-old", "f9", "models:/old@prod") is None
    assert version_of_files(client, "it's", "f9", "/x") is None


def test_the_files_key_of_a_folder_now_is_the_import_steps_and_moves_with_its_files(tmp_path):
    from hf_models import save_classifier

    from ttt_pipeline import steps
    from ttt_pipeline.io.model_source import fetched
    from ttt_pipeline.storage import StepOutput, StepStore

    folder = save_classifier(tmp_path / "clf")
    data = StepOutput("download", "k", str(tmp_path), "d", meta={"label_names": LABELS})
    cfg = load_config("demo", ["ttt.methods=[none, spell]"])
    with fetched(str(folder), "") as source:
        model = steps.import_model(cfg, data, source, StepStore(tmp_path / "store"))
    assert imported_files(model.to_dict()) == current_files(str(folder), "")
    before = current_files(str(folder), "")
    (folder / "config.json").write_text((folder / "config.json").read_text().replace("negative", "Negative"))
    assert current_files(str(folder), "") != before
    assert imported_files({"path": str(tmp_path / "nowhere")}) is None
