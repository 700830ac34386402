"""The closing lines of `run` and `evaluate`: the registered model's name and the commands that use it next."""

from __future__ import annotations

import shlex

from ttt_pipeline.cli.next_steps import next_commands, next_lines, registered_line, rerun_arguments

NAME = "ttt-demo-reviews-negative-positive-hf-classifier"
PROMOTED = {"model_name": NAME, "version": "3", "champion_after": "3", "decision": "promoted",
            "reason": "no champion yet"}
KEPT = {"model_name": NAME, "version": "4", "champion_after": "3", "decision": "kept",
        "reason": "0.5000 <= champion v3 0.6000"}


def test_a_champion_is_predicted_served_and_rechecked_by_its_name():
    again = rerun_arguments("path/to/hf-classifier", "demo", ["model.label_map={LABEL_0: negative, LABEL_1: positive}"])
    predict, serve, reevaluate = next_commands(PROMOTED, again, program=".venv/bin/ttt-pipeline")
    assert predict == (f".venv/bin/ttt-pipeline predict --model models:/{NAME}@champion --input reviews.csv "
                       "--output predictions.jsonl")
    assert serve == f".venv/bin/ttt-pipeline serve --model {NAME}"
    assert shlex.split(reevaluate) == [".venv/bin/ttt-pipeline", "reevaluate", "--model", "path/to/hf-classifier",
                                       "--config", "demo", "--set",
                                       "model.label_map={LABEL_0: negative, LABEL_1: positive}"]


def test_a_version_that_did_not_win_is_predicted_by_its_number_and_the_store_named_where_not_the_default():
    predict, serve, reevaluate = next_commands(KEPT, ["--config", "demo"], ["--tracking-uri", "http://mlflow:5000"])
    assert f"--model models:/{NAME}/4 " in predict and predict.endswith("--tracking-uri http://mlflow:5000")
    assert serve == f"ttt-pipeline serve --model {NAME} --tracking-uri http://mlflow:5000"
    assert reevaluate == "ttt-pipeline reevaluate --config demo"  # the store comes with the config's --set


def test_nothing_registered_gives_no_commands_and_says_why():
    skipped = {"model_name": NAME, "version": None, "reason": "no fine-tune run with a logged model"}
    assert next_commands(None, ["--config", "demo"]) == next_commands(skipped, ["--config", "demo"]) == []
    assert registered_line(None).startswith("registry: off")
    assert next_lines(skipped, []) == "registry: nothing registered (no fine-tune run with a logged model)"


def test_the_terminal_lines_name_the_model_then_list_the_commands():
    commands = next_commands(PROMOTED, ["--config", "demo"])
    lines = next_lines(PROMOTED, commands).splitlines()
    assert lines[0] == f"registered model: {NAME} v3, now the champion (no champion yet)"
    assert [line.strip() for line in lines[2:]] == commands
    assert "the champion stays v3" in registered_line(KEPT)


def test_test_reviews_split_off_by_the_preset_are_said_to_be_possibly_seen_in_training():
    from ttt_pipeline.cli.next_steps import overlap_note
    from ttt_pipeline.config import load_config

    demo = load_config("demo").data
    note = overlap_note(demo, "split", 129)
    assert note.startswith(f"the 129 test reviews are 30% of {demo.path}, split off by the preset (seed 42): ")
    assert note.endswith("give reviews it never saw with --set data.test_path=FILE")
    assert overlap_note(demo, "source", 129) is None
    own = load_config("demo", ["data.test_path=my_test.csv"]).data
    assert overlap_note(own, "test_path", 40) is None and overlap_note(own, None, None) is None
    # a store entry made before the download step recorded where its test reviews came from
    assert "(unless the source holds a test split of its own)" in overlap_note(demo, None, None)
