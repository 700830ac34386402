"""Helpers of the reliability suite: the real CLI in a subprocess (its configurations: tests/tiny_config.py,
suite="reliability")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]

# Loaded by the CLI's interpreter (via PYTHONPATH): at exit it records which modules were imported, which
# proves a run stopped in preflight: Prefect (and the flow) never loaded.
PROBE = """
import atexit, json, os, sys
_out = os.environ.get("TTT_PROBE_OUT")
if _out:
    def _dump():
        mods = set(sys.modules)
        with open(_out, "w") as f:
            json.dump({"prefect": any(m == "prefect" or m.startswith("prefect.") for m in mods),
                       "flow": "ttt_pipeline.flows.pipeline" in mods, "torch_trained": "ttt_pipeline.modeling.train" in mods}, f)
    atexit.register(_dump)
_fault = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault.py")
if os.path.exists(_fault):  # a test's injected failure (tests/reliability/test_out_of_memory_cli.py)
    exec(compile(open(_fault).read(), _fault, "exec"))
"""


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    probe: dict

    @property
    def summary(self) -> dict:
        return json.loads(self.stdout.strip().splitlines()[-1])


def cli_env(tmp: Path, probe_out: Path | None = None) -> dict:
    probe_dir = tmp / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    (probe_dir / "sitecustomize.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(probe_dir), os.environ.get("PYTHONPATH")])),
           "PREFECT_HOME": str(tmp / "prefect-home"), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           # Prefect's temporary server gets 20 s to start by default: too little on a loaded 2-core CI box
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    env.pop("TTT_DEBUG", None)
    env.pop("TTT_TRACKING_URI", None)
    if probe_out is not None:
        env["TTT_PROBE_OUT"] = str(probe_out)
    return env


def write_config(tmp: Path, cfg: dict) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli_args(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ttt_pipeline.cli.main", "run", "--config", str(config), *extra]


def run_cli(tmp: Path, cfg: dict, *extra: str, timeout: float = 600, debug: str = "") -> CliRun:
    """debug: "" (off), "before" (`ttt-pipeline --debug run`) or "after" (`ttt-pipeline run --debug`)."""
    config = write_config(tmp, cfg)
    probe = tmp / "probe.json"
    args = cli_args(config, *extra)
    if debug:
        args.insert(3 if debug == "before" else len(args), "--debug")
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=cli_env(tmp, probe), cwd=REPO, timeout=timeout)
    seconds = time.perf_counter() - t0
    return CliRun(proc.returncode, proc.stdout, proc.stderr, seconds,
                  json.loads(probe.read_text()) if probe.is_file() else {})


def assert_plain_error(run: CliRun, *needles: str) -> None:
    """Exit 2; stderr is `error: ...` and optionally `hint: ...`, nothing else; no traceback anywhere."""
    assert run.returncode == 2, (run.returncode, run.stderr[-3000:])
    lines = run.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, run.stderr
    assert lines[0].startswith("error: "), run.stderr
    if len(lines) == 2:
        assert lines[1].startswith("hint: "), run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    for needle in needles:
        assert needle in run.stderr, (needle, run.stderr)


def has_mallinfo2() -> bool:
    """glibc 2.33 or later: its mallinfo2 measures the heap (the heap tests' probes read it)."""
    import ctypes
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


def heap_probe_env(drop: tuple[str, ...] = (), **env: str) -> dict[str, str]:
    """This environment without `drop`, glibc's MALLOC_*_ variables, GLIBC_TUNABLES and LD_PRELOAD (each can fix
    glibc's thresholds or bypass its heap), then `env`: a heap probe's child sees glibc's defaults."""
    clean = {k: v for k, v in os.environ.items() if k not in drop + ("GLIBC_TUNABLES", "LD_PRELOAD")
             and not (k.startswith("MALLOC_") and k.endswith("_"))}
    return {**clean, **env}
