"""docs/architecture.md stays true: every file path, module, function and setting it names exists in the tree."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
CODE = "\n".join(p.read_text(encoding="utf-8") for root in ("ttt_pipeline", "scripts", "bench")
                 for p in (REPO / root).rglob("*.py")) + (REPO / "pyproject.toml").read_text() + \
    (REPO / "Makefile").read_text()
# what the doc writes in backticks that is neither code nor a file: commands, events, store paths, placeholders
NOT_NAMES = re.compile(r"^(ttt-pipeline\b|make\b|ttt\.(champion|nightly|traffic)\.|\.cache/|<|--|error:|hint:|"
                       r"acc_|python -m|pip |torchrun|https?://)")
PATH = re.compile(r"^[\w./<>-]+(\.(py|md|yaml|toml|json|parquet|safetensors)|/)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(\(\))?$")
WORD = re.compile(r"^_?[a-z][a-z0-9]*(_[a-z0-9]+)+$")


LOCALS = {"own.lr"}  # a variable of the walk-through's code, not a name in the tree


def _method(span: str) -> bool:
    """`Classifier.settings`: a class of the code with that method."""
    cls, _, name = span.removesuffix("()").partition(".")
    return cls[:1].isupper() and re.search(rf"^class {cls}\b(.|\n)*?^    def {name}\b", CODE, re.M) is not None


def _spans() -> list[str]:
    text = re.sub(r"```.*?```", "", DOC.read_text(encoding="utf-8"), flags=re.S)  # code blocks: drawn, not named
    return sorted({s.strip() for s in re.findall(r"`([^`\n]+)`", text)})


def _path_exists(span: str) -> bool:
    span = span.split(":")[0]
    if "<" in span:  # a pattern (`<step>_step.py`): some file matches it
        pattern = re.sub(r"<[^>]+>", "*", span)
        return any(any(base.glob(pattern)) for base in (REPO, REPO / "ttt_pipeline"))
    if "/" not in span:  # a bare file name (`records.py`): a file of the package of that name
        return any((REPO / "ttt_pipeline").rglob(span))
    return any((base / span).exists() for base in (REPO, REPO / "ttt_pipeline", REPO / "tests"))


def _python_name(span: str) -> bool:
    parts = span.removesuffix("()").split(".")
    for start in ("ttt_pipeline.", ""):
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(start + ".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
                return True
            except AttributeError:
                break
    return False


def _config_field(span: str) -> bool:
    from pydantic import BaseModel

    from ttt_pipeline.config import PipelineConfig

    node: type | None = PipelineConfig
    for part in span.removeprefix("cfg.").split("."):
        fields = getattr(node, "model_fields", {}) if isinstance(node, type) and issubclass(node, BaseModel) else {}
        if part not in fields:
            return False
        node = fields[part].annotation
    return True


def _exists(span: str) -> bool:
    if PATH.match(span):  # a source file must be in the tree; an artifact's name (`meta.json`) in the code
        return _path_exists(span) or (not span.endswith(".py") and span.rstrip("/") in CODE)
    if DOTTED.match(span):
        return (_python_name(span) or _config_field(span) or _config_field(f"ttt.{span}")  # a request's flat `tent.lr`
                or _path_exists(span.replace(".", "/") + ".py") or _method(span) or span in LOCALS
                or _moved(span))
    return re.search(rf"\b{re.escape(span)}\b", CODE) is not None


def _moved(span: str) -> bool:
    """An older release's key (`ttt.tent_lr`) that `config.MOVED_KEYS` points at its new place."""
    from ttt_pipeline.config import MOVED_KEYS

    section, _, key = span.partition(".")
    return section == "ttt" and key in MOVED_KEYS  # the keys moved inside the `ttt` section


def test_the_doc_names_only_what_exists():
    names = [s for s in _spans() if not NOT_NAMES.match(s) and (PATH.match(s) or DOTTED.match(s) or WORD.match(s))]
    assert len(names) > 60  # the doc names the tree; a regex that matched nothing would pass vacuously
    missing = [s for s in names if not _exists(s)]
    assert missing == [], f"docs/architecture.md names what the tree does not hold: {missing}"


@pytest.mark.parametrize("planted", ["ttt_pipeline/tasks/stages.py", "steps._score_jobs", "_score_jobs",
                                     "io/registry.py"])
def test_a_stale_name_is_caught(planted):
    assert not _exists(planted)


def test_the_parameter_walk_counts_its_files():
    section = DOC.read_text(encoding="utf-8").split("## One parameter's path", 1)[1].split("\n## ", 1)[0]
    files = set(re.findall(r"`((?:[\w]+/)+[\w]+\.py)`", section))
    words = {8: "Eight", 9: "Nine", 10: "Ten", 11: "Eleven", 12: "Twelve"}
    assert f"{words[len(files)]} files, one type" in section, sorted(files)
