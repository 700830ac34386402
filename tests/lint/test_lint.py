"""`make lint` holds the layering: it passes on the tree and fails on a deliberate violation of each kind
(an MLflow import in the pure core, an import of the orchestration from io, a defense importing another,
argparse outside the command line, a ruff error, a function longer than a screen)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PACKAGES = ("ttt_pipeline",)


def _tools() -> None:
    for tool in ("ruff", "lint-imports"):
        if not (BIN / tool).exists():
            pytest.skip(f"{tool} is not installed in this environment (make setup installs the test extra)")


def _copy(tmp_path: Path) -> Path:
    """The packages and pyproject.toml in a scratch folder, which comes first on the import path there."""
    root = tmp_path / "tree"
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def _contracts(root: Path) -> subprocess.CompletedProcess:
    env = {"PATH": str(BIN), "PYTHONPATH": str(root), "HOME": str(root)}
    return subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")


def test_the_tree_keeps_every_contract(tmp_path):
    _tools()
    proc = _contracts(_copy(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("ttt_pipeline/modeling/model.py", "import mlflow  # noqa", "The pure core imports neither"),
    ("ttt_pipeline/evaluation/stats.py", "from ttt_pipeline.io import tracking  # noqa", "The pure core imports"),
    ("ttt_pipeline/io/runs.py", "import ttt_pipeline.flows.pipeline  # noqa", "The side-effect layer (io) never imports"),
    ("ttt_pipeline/defenses/tent.py", "from ttt_pipeline.defenses import spell  # noqa", "Defenses are independent"),
    ("ttt_pipeline/modeling/train.py", "from ttt_pipeline.defenses import base  # noqa", "Inside the core"),
    ("ttt_pipeline/tasks/progress.py", "import ttt_pipeline.flows.pipeline  # noqa", "cli -> flows -> tasks -> events -> library"),
    ("ttt_pipeline/reports/run.py", "import argparse  # noqa", "Only the command line (cli) parses arguments"),
    ("ttt_pipeline/io/nights.py", "import ttt_pipeline.events  # noqa", "The side-effect layer (io) never imports"),
    ("ttt_pipeline/nightly.py", "import ttt_pipeline.io.nights  # noqa", "The pure core imports"),
    ("ttt_pipeline/events.py", "import ttt_pipeline.tasks  # noqa", "cli -> flows -> tasks -> events -> library"),
    ("ttt_pipeline/modeling/model.py", "from ttt_pipeline.modeling import loading  # noqa", "No import circle"),
    ("ttt_pipeline/data/readers.py", "from ttt_pipeline.data import sources  # noqa", "No import circle"),
])
def test_a_deliberate_violation_breaks_its_contract(tmp_path, module, line, contract):
    _tools()
    root = _copy(tmp_path)
    _append(root / module, line)
    proc = _contracts(root)
    assert proc.returncode != 0, proc.stdout[-3000:]
    broken = proc.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, proc.stdout[-3000:]


def test_ruff_and_the_function_length_check_fail_on_a_violation(tmp_path):
    _tools()
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef long():\n" + "    x = 1\n" * 81 + "    return x\n", encoding="utf-8")
    ruff = subprocess.run([str(BIN / "ruff"), "check", "--config", str(REPO / "pyproject.toml"), str(bad)],
                          capture_output=True, text=True)
    assert ruff.returncode == 1 and "F401" in ruff.stdout, ruff.stdout
    length = subprocess.run([sys.executable, str(REPO / "scripts" / "function_length.py"), str(tmp_path)],
                            capture_output=True, text=True)
    assert length.returncode == 1 and "long is 83 lines (limit 80)" in length.stdout, length.stdout
    ok = subprocess.run([sys.executable, str(REPO / "scripts" / "function_length.py"), "ttt_pipeline", "bench"],
                        cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout


def _first_party_imports():
    """(file, line, module, names) of every import of our packages, module level or inside a function."""
    import ast

    for pkg in PACKAGES + ("bench",):
        for path in sorted((REPO / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                        node.module.split(".")[0] in PACKAGES:
                    yield path.relative_to(REPO), node.lineno, node.module, [a.name for a in node.names]
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] in PACKAGES:
                            yield path.relative_to(REPO), node.lineno, alias.name, []


def test_every_import_of_our_packages_resolves():
    """Lazy imports inside functions run only when their branch does: a module moved without its importers
    updated would fail a run late (a plot, a rare command). Each one is resolved here, names included."""
    import importlib

    bad = []
    for where, line, module, names in _first_party_imports():
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            bad.append(f"{where}:{line}: {module} ({exc})")
            continue
        for name in names:
            if name != "*" and not hasattr(mod, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    bad.append(f"{where}:{line}: {module} has no {name}")
    assert not bad, "\n".join(bad)


def test_the_reports_name_no_defense_and_the_check_catches_one(tmp_path):
    """scripts/defense_names.py (in `make lint`): the reporting modules pass; a hard-coded defense name in code,
    alone or in a combination, fails naming its line; docstrings and `none` are allowed."""
    script = str(REPO / "scripts" / "defense_names.py")
    ok = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout
    bad = tmp_path / "report.py"
    bad.write_text('"""Scores masked_ttt and tent."""\nBASE = "none"\nX = 1\nM = "tent"\nC = "spell+masked_ttt"\n')
    found = subprocess.run([sys.executable, script, str(bad)], capture_output=True, text=True, timeout=120)
    assert found.returncode == 1
    assert [line.split(":")[1] for line in found.stdout.splitlines()] == ["4", "5"]


def test_the_registry_labels_and_headline_keys():
    from ttt_pipeline.defenses import registry

    assert registry.label("spell+masked_ttt") == "spelling repair + masked TTT"
    assert registry.label("none") == "no adaptation" and registry.label("not-a-method") == "not-a-method"
    assert registry.label("dedupe") == "dedupe"  # no label: as written
    assert registry.style("tent") == {"color": "#1f77b4", "marker": "^"} and registry.style("spell+tent") is None
    assert registry.headline_method("ttt") == "masked_ttt"
    assert {m: e.headline for m, e in registry.headline_methods().items()} == {"masked_ttt": "ttt", "tent": "tent"}
