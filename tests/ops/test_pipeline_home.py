"""The deployments' pull step: which folder a worker's run works in (prefect.yaml, ttt_pipeline.flows.gpu_pool)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from ttt_pipeline.flows.gpu_pool import enter_pipeline_home


@pytest.fixture()
def env(monkeypatch, tmp_path):
    monkeypatch.delenv("TTT_PIPELINE_HOME", raising=False)
    monkeypatch.delenv("PWD", raising=False)
    project = tmp_path / "project"
    project.mkdir()
    return monkeypatch, project


def test_the_home_is_ttt_pipeline_home_when_set(env, tmp_path):
    monkeypatch, project = env
    monkeypatch.setenv("TTT_PIPELINE_HOME", str(project))
    monkeypatch.chdir(tmp_path)
    assert enter_pipeline_home() == {"directory": str(project.resolve())}
    monkeypatch.setenv("TTT_PIPELINE_HOME", str(tmp_path / "gone"))
    with pytest.raises(RuntimeError, match=r"gone \(TTT_PIPELINE_HOME\) is not a folder"):
        enter_pipeline_home()


def test_unset_it_is_the_current_folder(env):
    """A pool with `working_dir` starts runs there: that folder is the home."""
    monkeypatch, project = env
    monkeypatch.chdir(project)
    monkeypatch.setenv("PWD", "/somewhere/else")
    assert enter_pipeline_home() == {"directory": str(project.resolve())}


def test_unset_in_a_process_workers_temporary_folder_it_is_the_workers_folder(env):
    """Without `working_dir` a process worker runs each flow in a fresh `tmp...prefect` folder and passes its
    environment on: $PWD is the folder the worker was started in."""
    monkeypatch, project = env
    with tempfile.TemporaryDirectory(suffix="prefect") as throwaway:  # what prefect.workers.process makes
        monkeypatch.chdir(throwaway)
        monkeypatch.setenv("PWD", str(project))
        assert enter_pipeline_home() == {"directory": str(project.resolve())}
        monkeypatch.delenv("PWD")
        with pytest.raises(RuntimeError, match="TTT_PIPELINE_HOME is not set on this worker"):
            enter_pipeline_home()
        monkeypatch.chdir(Path(throwaway).parent)
