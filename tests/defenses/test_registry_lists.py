"""The lists of defenses outside the registry stay in step with it: every defense has a summary, the help texts
(`ttt.methods`, `ttt-pipeline predict --help`) print every one, and pyproject.toml's "Defenses are independent"
import contract holds exactly the registry's defense modules."""

from __future__ import annotations

import argparse
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

import ttt_pipeline.defenses
from ttt_pipeline.cli.main import build_parser
from ttt_pipeline.config import TTTConfig
from ttt_pipeline.config.schema import _methods_description
from ttt_pipeline.defenses import registry

REPO = Path(__file__).resolve().parents[2]
NOT_DEFENSES = {"ttt_pipeline.defenses.vocabulary"}  # in the contract too (no defense may import it), no defense


def _contract() -> dict:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (found,) = [c for c in contracts if c["type"] == "independence" and c["name"].startswith("Defenses are")]
    return found


def _gaps(listed: list[str]) -> tuple[set[str], set[str]]:
    """(defense modules of the registry the contract lacks, modules it lists that are no defense of the registry)."""
    want, have = set(registry.modules().values()), set(listed) - NOT_DEFENSES
    return want - have, have - want


def _predict_help() -> str:
    root = build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["predict"].format_help()


def test_every_defense_has_a_one_line_summary():
    rows = registry.describe()
    assert [name for name, _, _ in rows] == [*registry.ENGINES, *registry.REPAIRS]
    assert {kind for _, kind, _ in rows} == {"engine", "repair"}
    assert [kind for name, kind, _ in rows if name in registry.REPAIRS] == ["repair"] * len(registry.REPAIRS)
    for name, _, summary in rows:
        assert summary.strip() == summary and summary, name
        assert len(summary) <= 90 and "\n" not in summary, name


def test_registry_modules_exist():
    mods = registry.modules()
    assert set(mods) == (set(registry.ENGINES) | set(registry.REPAIRS)) - {"none"}
    assert mods["spell"] == "ttt_pipeline.defenses.spell" and mods["dedupe"] == "ttt_pipeline.defenses.dedupe"
    assert [m for m in mods.values() if importlib.util.find_spec(m) is None] == []


def test_independence_contract_lists_every_defense_module():
    listed = _contract()["modules"]
    assert len(listed) == len(set(listed))
    assert _gaps(listed) == (set(), set())
    assert NOT_DEFENSES <= set(listed)


def test_contract_ignores_only_imports_between_its_modules():
    listed = set(_contract()["modules"])
    for rule in _contract()["ignore_imports"]:
        importer, imported = (m.strip() for m in rule.split("->"))
        assert {importer, imported} <= listed, rule


def test_a_defense_missing_from_the_contract_fails_the_check(monkeypatch):
    monkeypatch.setitem(registry.ENGINES, "planted", registry.Entry("planted", "a planted engine"))
    assert _gaps(_contract()["modules"]) == ({"ttt_pipeline.defenses.planted"}, set())
    monkeypatch.delitem(registry.REPAIRS, "dedupe")
    assert _gaps(_contract()["modules"]) == ({"ttt_pipeline.defenses.planted"}, {"ttt_pipeline.defenses.dedupe"})


def test_methods_help_lists_every_defense_with_its_summary():
    text = TTTConfig.model_fields["methods"].description
    for name, _, summary in registry.describe():
        assert f"{name} ({summary})" in text, name
    assert "spell+masked_ttt" in text and "against none" in text


def test_predict_help_lists_every_defense_with_its_summary():
    lines = _predict_help().splitlines()
    for name, kind, summary in registry.describe():
        assert [ln for ln in lines if ln.split()[:2] == [name, kind] and ln.endswith(summary)], name


def test_help_texts_are_rendered_from_the_registry(monkeypatch):
    monkeypatch.setitem(registry.REPAIRS, "planted", registry.Entry("planted", "a planted repair, 100% new"))
    assert "planted (a planted repair, 100% new)" in _methods_description()
    rows = [ln.split(None, 2) for ln in _predict_help().splitlines()]
    assert ["planted", "repair", "a planted repair, 100% new"] in rows  # verbatim: argparse leaves the epilog alone


def test_predict_method_takes_compositions():
    args = build_parser().parse_args(["predict", "--model", "m", "--input", "a.txt", "--output", "b.csv",
                                      "--method", "spell+dedupe+masked_ttt"])
    assert args.method == "spell+dedupe+masked_ttt"
    assert registry.parse(args.method) == registry.Method(args.method, ("spell", "dedupe"), "masked_ttt")
    with pytest.raises(ValueError, match="unknown method 'spell\\+bogus'"):
        registry.parse("spell+bogus")


def test_package_docstring_lists_no_defenses_by_hand():
    words = set(re.findall(r"\w+", ttt_pipeline.defenses.__doc__))
    assert words & (set(registry.ENGINES) | set(registry.REPAIRS)) <= {"spell", "masked_ttt"}  # the example
