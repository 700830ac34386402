"""`ttt-pipeline evaluate --model FOLDER` on a Hugging Face folder with a broken file: the project's own error.

A tiny BERT sequence classifier is saved the way users save theirs (tests/hf_models.py), then broken one way per
copy: config.json not JSON or without model_type, labels that do not match the head's shape, a pickled
pytorch_model.bin that `weights_only` loading refuses, a model.safetensors cut short or with a bad header, and
tokenizer files that are damaged or cut short. Each goes through the real CLI in this process: exit 2, `error:`
naming the file, `hint:` with the fix, no traceback, nothing imported into the store and nothing registered in
MLflow. The check module (ttt_pipeline/modeling/folder_checks.py) is tested on each file directly too.
"""

from __future__ import annotations

import json
import pickle
import shutil
import types
from pathlib import Path

import pytest
import torch
from hf_models import save_classifier

from ttt_pipeline.errors import ConfigError
from ttt_pipeline.modeling import folder_checks
from ttt_pipeline.modeling.hf_classifier import Source, check_folder

WHERE = "model.classifier 'X'"


def edit_config(folder: Path, **changes) -> None:
    """config.json with `changes` laid over it (a value of None removes the key)."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))


def state_dict(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def break_copy(good: Path, root: Path, case: str) -> Path:
    """A copy of `good` broken the way `case` says."""
    folder = shutil.copytree(good, root / case)
    weights = folder / "model.safetensors"
    if case == "config-not-json":
        (folder / "config.json").write_text('{"architectures": ["BertForSequenceClassification"],, "model_type": ')
    elif case == "config-no-model-type":
        edit_config(folder, model_type=None)
    elif case == "id2label-3-head-2":
        edit_config(folder, id2label={"0": "neg", "1": "neutral", "2": "pos"}, label2id={"neg": 0, "neutral": 1,
                                                                                      "pos": 2})
    elif case == "num-labels-3-head-2":
        edit_config(folder, id2label=None, label2id=None, num_labels=3)
    elif case == "pickled-bin":  # training arguments saved beside the tensors: a pickle of more than tensors
        torch.save({**state_dict(folder), "args": types.SimpleNamespace(lr=2e-5)}, folder / "pytorch_model.bin")
        weights.unlink()
    elif case == "safetensors-cut-short":
        truncate(weights)
    elif case == "safetensors-bad-header":
        data = weights.read_bytes()
        weights.write_bytes(data[:8] + b"{not json" + data[17:])
    elif case == "tokenizer-json-cut-short":
        truncate(folder / "tokenizer.json")
    elif case == "tokenizer-json-binary":
        (folder / "tokenizer.json").write_bytes(b"\xff\xfe\x00\x01 not text")
    elif case == "tokenizer-json-not-a-tokenizer":
        (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    elif case == "tokenizer-config-invalid":
        (folder / "tokenizer_config.json").write_text('{"model_max_length": 512,}')
    else:
        raise ValueError(case)
    return folder


# case -> (the file the error names, words of the error, words of the hint)
CASES = {
    "config-not-json": ("config.json", ["is not valid JSON", "line 1 column"], ["model.config.save_pretrained"]),
    "config-no-model-type": ("config.json", ["has no model_type"], ['"model_type": "bert"']),
    "id2label-3-head-2": ("config.json", ["id2label with 3 labels (neg, neutral, pos)", "model.safetensors",
                                          "classifier.weight, shape [2, 32]) has 2 outputs"],
                          ["different models", "the head's 2 labels"]),
    "num-labels-3-head-2": ("config.json", ["num_labels 3", "has 2 outputs"], ["num_labels 2"]),
    "pickled-bin": ("pytorch_model.bin", ["refused for safety", "could run code", "types.SimpleNamespace"],
                    ["only if you trust the file", "weights_only=False", "safe_serialization=True"]),
    "safetensors-cut-short": ("model.safetensors", ["is cut short", "file not fully covered"],
                              ["copy it again", "save_pretrained"]),
    "safetensors-bad-header": ("model.safetensors", ["header that is not valid", "invalid JSON in header"],
                               ["copy it again", "save_pretrained"]),
    "tokenizer-json-cut-short": ("tokenizer.json", ["is not valid JSON", "cut short"],
                                 ["tokenizer.save_pretrained"]),
    "tokenizer-json-binary": ("tokenizer.json", ["not UTF-8 text"], ["tokenizer.save_pretrained"]),
    "tokenizer-json-not-a-tokenizer": ("tokenizer.json", ["not a tokenizer the tokenizers library reads"],
                                       ["tokenizer.save_pretrained"]),
    "tokenizer-config-invalid": ("tokenizer_config.json", ["is not valid JSON", "line 1 column 26"],
                                 ["tokenizer.save_pretrained"]),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A valid tiny BERT classifier over the demo data's labels (negative, positive)."""
    return save_classifier(tmp_path_factory.mktemp("good") / "bert", "bert")


@pytest.fixture(scope="module")
def broken(good, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("broken")
    return {case: break_copy(good, root, case) for case in CASES}


def cli(tmp: Path, capsys, model: Path) -> tuple[int, str]:
    """`ttt-pipeline evaluate --model MODEL --config demo` in this process, with its own store and MLflow."""
    from ttt_pipeline.cli.main import main

    rc = main(["evaluate", "--model", str(model), "--config", "demo", "--set", f"store={tmp / 'store'}",
               "--set", f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}",
               "--set", f"tracking.artifact_root={tmp / 'mlruns'}"])
    return rc, capsys.readouterr().err


def registered(tmp: Path) -> list[str]:
    from mlflow.tracking import MlflowClient

    db = tmp / "mlflow.db"
    return [m.name for m in MlflowClient(f"sqlite:///{db}").search_registered_models()] if db.exists() else []


@pytest.mark.parametrize("case", CASES)
def test_a_broken_file_stops_the_cli_with_the_file_named_and_its_fix(broken, tmp_path, capsys, case):
    name, words, hint_words = CASES[case]
    rc, err = cli(tmp_path, capsys, broken[case])
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), err
    assert "Traceback" not in err and "Error:" not in lines[0], err  # no library exception's name passed through
    assert str(broken[case] / name) in lines[0], err
    assert all(w in lines[0] for w in words), err
    assert all(w in lines[1] for w in hint_words), err
    assert registered(tmp_path) == []
    assert not list((tmp_path / "store").glob("import-model/*/manifest.json"))  # it stopped before the import


# ---------------------------------------------------------------------- the check module, file by file


def test_the_valid_folder_passes_every_check_and_its_head_matches_its_two_labels(good):
    config = check_folder(Source("X", str(good), str(good)), trust_remote_code=False)
    assert config["model_type"] == "bert" and folder_checks.config_labels(config) == 2
    shapes = folder_checks.weight_shapes(good / "model.safetensors", WHERE, config)
    assert shapes == {k: tuple(v.shape) for k, v in state_dict(good).items()}
    assert folder_checks.head_weight(shapes) == ("classifier.weight", (2, 32))


@pytest.mark.parametrize("case", ["config-not-json", "config-no-model-type"])
def test_check_config_names_config_json(broken, case):
    with pytest.raises(ConfigError) as err:
        folder_checks.check_config(broken[case], WHERE)
    assert err.value.message.startswith(f"{WHERE}: {broken[case] / 'config.json'} ")
    assert all(w in err.value.message for w in CASES[case][1]) and err.value.hint


@pytest.mark.parametrize("text, words", [
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"model_type": "bert", "id2label": ["neg", "pos"]}', "id2label in"),
])
def test_check_config_refuses_json_that_is_not_a_config(tmp_path, text, words):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=words):
        folder_checks.check_config(tmp_path, WHERE)


@pytest.mark.parametrize("case", ["id2label-3-head-2", "num-labels-3-head-2", "pickled-bin", "safetensors-cut-short",
                                  "safetensors-bad-header"])
def test_check_weights_reads_the_shapes_without_loading_and_names_the_file(broken, case):
    config = json.loads((broken[case] / "config.json").read_text())
    with pytest.raises(ConfigError) as err:
        folder_checks.check_weights(broken[case], config, WHERE)
    name, words, hint_words = CASES[case]
    assert str(broken[case] / name) in err.value.message
    assert all(w in err.value.message for w in words) and all(w in err.value.hint for w in hint_words)


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("tokenizer")])
def test_check_tokenizer_files_names_the_broken_one(broken, case):
    with pytest.raises(ConfigError) as err:
        folder_checks.check_tokenizer_files(broken[case], WHERE)
    assert str(broken[case] / CASES[case][0]) in err.value.message
    assert all(w in err.value.message for w in CASES[case][1])


def test_a_pickle_of_tensors_only_passes_and_its_head_is_checked_too(good, tmp_path):
    """A plain state dict in pytorch_model.bin is safe to load: it passes, and a head of 2 against 3 labels in
    config.json is caught from the pickle's shapes, read onto the meta device."""
    folder = shutil.copytree(good, tmp_path / "bin")
    torch.save(state_dict(folder), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    config = json.loads((folder / "config.json").read_text())
    folder_checks.check_weights(folder, config, WHERE)
    with pytest.raises(ConfigError, match=r"num_labels 3, but the classification head in pytorch_model.bin"):
        folder_checks.check_weights(folder, {**config, "id2label": None, "num_labels": 3}, WHERE)


def test_the_hints_conversion_snippet_turns_the_refused_pickle_into_the_same_safetensors(good, broken, tmp_path):
    """The hint's Python, run where the file is trusted (here: the test's own), writes model.safetensors with the
    good model's tensors, and the folder then passes."""
    folder = shutil.copytree(broken["pickled-bin"], tmp_path / "converted")
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(ConfigError) as err:
        folder_checks.check_weights(folder, config, WHERE)
    snippet = err.value.hint.split("in Python: ", 1)[1].rsplit("; then give the folder again", 1)[0]
    assert str(folder) in snippet
    exec(compile(snippet, "hint", "exec"), {})
    folder_checks.check_weights(folder, json.loads((folder / "config.json").read_text()), WHERE)
    got, want = state_dict(folder), state_dict(good)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_sharded_safetensors_are_read_shard_by_shard_and_a_missing_shard_is_named(good, tmp_path):
    from transformers import AutoModelForSequenceClassification

    folder = tmp_path / "sharded"
    AutoModelForSequenceClassification.from_pretrained(good).save_pretrained(folder, max_shard_size="200KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").is_file()
    config = json.loads((folder / "config.json").read_text())
    shapes = folder_checks.weight_shapes(folder_checks.weights_file(folder), WHERE, config)
    assert shapes == {k: tuple(v.shape) for k, v in state_dict(good).items()}
    shards[-1].unlink()
    with pytest.raises(ConfigError, match=f"names 1 weight shards that are not in the folder .e.g. {shards[-1].name}"):
        folder_checks.check_weights(folder, config, WHERE)


def test_load_errors_maps_the_librarys_exceptions_at_the_load_call_and_passes_others(tmp_path):
    from safetensors import SafetensorError

    raised = {
        "is cut short": SafetensorError("Error while deserializing header: incomplete metadata"),
        "refused for safety": pickle.UnpicklingError("Weights only load failed. ... WeightsUnpickler error: "
                                                     "Unsupported global: GLOBAL argparse.Namespace"),
        "the weights' shapes do not match": RuntimeError("You set `ignore_mismatched_sizes` to `False`"),
        "a JSON file in": json.JSONDecodeError("Expecting value", "{", 1),
    }
    for words, exc in raised.items():
        with pytest.raises(ConfigError, match=words) as err:
            with folder_checks.load_errors(WHERE, tmp_path):
                raise exc
        assert str(tmp_path) in err.value.message and err.value.hint
    with pytest.raises(RuntimeError, match="CUDA error"):  # not about the files: passed through as it is
        with folder_checks.load_errors(WHERE, tmp_path):
            raise RuntimeError("CUDA error: device-side assert triggered")
