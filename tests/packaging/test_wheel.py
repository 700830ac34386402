"""Issue 33: the wheel a user installs. One top-level name in site-packages (cli, flows and tasks live under
`ttt_pipeline`), the presets and demo reviews inside it, and the installed command works from any folder."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # no build isolation: setuptools from this venv, so the test needs no index
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(REPO)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("ttt_pipeline-*.whl")
    return whl


def test_the_wheel_installs_one_top_level_package_with_its_presets(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"ttt_pipeline", wheel.name.split("-py")[0] + ".dist-info"}
    for member in ("ttt_pipeline/cli/main.py", "ttt_pipeline/flows/pipeline.py", "ttt_pipeline/tasks/step_tasks.py",
                   "ttt_pipeline/presets/demo.yaml", "ttt_pipeline/presets/demo/reviews.jsonl",
                   "ttt_pipeline/__main__.py"):
        assert member in names
    meta = [n for n in names if n.endswith("entry_points.txt")]
    assert "ttt-pipeline = ttt_pipeline.cli.main:main" in zipfile.ZipFile(wheel).read(meta[0]).decode()
    assert any(n.endswith("licenses/LICENSE") for n in names)


def test_the_installed_command_finds_its_preset_from_any_folder(wheel, tmp_path):
    """A fresh venv gets the wheel (no deps); the dependencies come from this venv's site-packages as a plain
    path entry, so this checkout's editable install is not on the path."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   timeout=300, capture_output=True)
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "deps.pth").write_text(site.getsitepackages()[0] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([str(py), "-c", "import ttt_pipeline; print(ttt_pipeline.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(purelib), where  # the installed copy, not this checkout
    version = subprocess.run([str(venv / "bin" / "ttt-pipeline"), "--version"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("ttt-pipeline "), version.stderr[-2000:]
    shown = subprocess.run([str(py), "-m", "ttt_pipeline", "config", "--config", "demo"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert str(Path(purelib, "ttt_pipeline", "presets", "demo", "reviews.jsonl")) in shown.stdout
    for generic in ("cli", "flows", "tasks"):
        assert not Path(purelib, generic).exists()
