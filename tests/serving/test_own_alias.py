"""`ttt-pipeline serve` follows a user's own alias (models:/my-classifier@prod), not only `champion`: the version it
serves is the one the alias points at now, on a real MLflow registry in SQLite."""

from __future__ import annotations

import pytest

from ttt_pipeline.cli.serve import model_and_alias
from ttt_pipeline.errors import ConfigError, PipelineError
from ttt_pipeline.io.serving import ChampionServer


def test_the_model_names_its_alias_or_takes_the_flags():
    assert model_and_alias("models:/my-classifier@prod", "champion") == ("my-classifier", "prod")
    assert model_and_alias("my-classifier", "prod") == ("my-classifier", "prod")
    assert model_and_alias("ttt-demo-reviews-negative-positive", "champion") == (
        "ttt-demo-reviews-negative-positive", "champion")
    for fixed in ("models:/my-classifier/3", "models:/@prod", "models:/a/b@prod"):
        with pytest.raises(ConfigError) as err:
            model_and_alias(fixed, "champion")
        assert "models:/NAME@ALIAS" in err.value.message and "mlflow models serve" in err.value.hint


def test_the_served_version_is_the_one_the_users_alias_points_at_now(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    client.create_registered_model("my-classifier")
    for _ in range(2):
        client.create_model_version("my-classifier", "file:///nowhere")
    client.set_registered_model_alias("my-classifier", "prod", "1")
    server = ChampionServer(client, "my-classifier", uri, tmp_path / "logs", alias="prod")
    assert server.champion_version() == "1"
    client.set_registered_model_alias("my-classifier", "prod", "2")  # a new version, registered by hand
    assert server.champion_version() == "2"
    with pytest.raises(PipelineError) as err:
        ChampionServer(client, "my-classifier", uri, tmp_path / "logs", alias="staging").champion_version()
    assert "no version at alias 'staging'" in err.value.message and "set_registered_model_alias" in err.value.hint
