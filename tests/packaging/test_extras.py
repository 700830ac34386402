"""The optional extras: traker (`[attribution]`) and gdown (`[gdrive]`) install only when asked for, and whatever
needs a missing one stops with `error:` naming what needs it and `hint: pip install 'ttt-pipeline[<extra>]'`."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ttt_pipeline.errors import ConfigError, PipelineError

REPO = Path(__file__).resolve().parents[2]


def test_traker_and_gdown_are_extras_that_make_setup_installs():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    hard = " ".join(project["dependencies"])
    assert "traker" not in hard and "gdown" not in hard
    extras = project["optional-dependencies"]
    assert [r.split(">")[0] for r in extras["attribution"]] == ["traker"]
    assert [r.split(">")[0] for r in extras["gdrive"]] == ["gdown"]
    setup = [line for line in (REPO / "Makefile").read_text().splitlines() if "pip install -q -e" in line]
    assert setup and all("attribution" in line and "gdrive" in line for line in setup)  # CI tests them
    pins = (REPO / "constraints.txt").read_text().splitlines()
    assert any(p.startswith("traker==") for p in pins) and any(p.startswith("gdown==") for p in pins)


@pytest.fixture()
def no_traker(monkeypatch):
    monkeypatch.setitem(sys.modules, "trak", None)  # `import trak` now fails as when traker is not installed


def test_the_attribute_step_asks_for_the_attribution_extra(no_traker):
    from ttt_pipeline.evaluation.attribution import _trak

    with pytest.raises(ConfigError) as err:
        _trak()
    assert "attribution.enabled" in err.value.message and "traker" in err.value.message
    assert err.value.hint.startswith("pip install 'ttt-pipeline[attribution]'")
    assert "attribution.enabled=false" in err.value.hint


def test_a_run_with_attribution_stops_before_any_work_without_traker(no_traker, monkeypatch):
    """The run command's input check and the flow (a deployment's run) both stop at once, not after training."""
    from ttt_pipeline.cli.main import preflight
    from ttt_pipeline.config import load_config
    from ttt_pipeline.flows import pipeline

    cfg = load_config("mdsd-electronics")
    assert cfg.attribution.enabled
    with pytest.raises(ConfigError, match="attribution.enabled"):
        preflight(cfg)  # the data (../shared/data/mdsd) is never read: the extra is checked first

    def no_tracking(tracking):
        raise AssertionError("the flow went on without traker")

    monkeypatch.setattr(pipeline.Tracker, "from_config", staticmethod(no_tracking))
    with pytest.raises(ConfigError, match="attribution.enabled"):
        pipeline.ttt_pipeline.fn(preset="mdsd-electronics")


def test_the_command_line_prints_error_and_hint_and_exits_2(tmp_path):
    code = ("import sys; sys.modules['trak'] = None\n"
            "from ttt_pipeline.cli.main import main\n"
            "sys.exit(main(['run', '--config', 'mdsd-electronics']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[-2].startswith("error: attribution.enabled") and "traker" in lines[-2]
    assert lines[-1].startswith("hint: pip install 'ttt-pipeline[attribution]'")
    assert "Traceback" not in out.stderr


def test_explain_of_a_run_without_attribution_asks_for_the_extra_first(monkeypatch):
    from types import SimpleNamespace

    from ttt_pipeline.io.explain import attribution_of

    run = SimpleNamespace(info=SimpleNamespace(run_id="r1", experiment_id="0"))
    client = SimpleNamespace(search_runs=lambda *a, **k: [])
    with pytest.raises(PipelineError) as installed:
        attribution_of(client, run, "sqlite:///mlflow.db")
    assert "ttt-pipeline[attribution]" not in installed.value.hint  # traker is here: only the setting is missing
    monkeypatch.setitem(sys.modules, "trak", None)
    with pytest.raises(PipelineError) as missing:
        attribution_of(client, run, "sqlite:///mlflow.db")
    assert "has no attribute stage" in missing.value.message
    assert missing.value.hint.startswith("pip install 'ttt-pipeline[attribution]'")
    assert "attribution.enabled=true" in missing.value.hint


def test_a_gdown_source_asks_for_the_gdrive_extra(monkeypatch, tmp_path):
    from ttt_pipeline.data.sources import fetch_gdown

    monkeypatch.setitem(sys.modules, "gdown", None)
    with pytest.raises(ConfigError) as err:
        fetch_gdown("1mpswNa37wFhcGd", tmp_path)
    assert "gdown://1mpswNa37wFhcGd" in err.value.message and "gdown" in err.value.message
    assert err.value.hint.startswith("pip install 'ttt-pipeline[gdrive]'") and "data.path" in err.value.hint


def test_a_broken_dependency_inside_an_installed_extra_is_not_reported_as_missing(monkeypatch):
    import importlib

    from ttt_pipeline.errors import require_extra

    real = importlib.import_module

    def broken(name, *args, **kwargs):
        if name == "gdown":  # gdown is there, one of its own imports is not
            raise ModuleNotFoundError("No module named 'bs4'", name="bs4")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="bs4"):
        require_extra("gdrive", "a test")
