"""Security properties checked statically and on the code paths: no remote code unless configured, no
pickle execution, no credentials in MLflow params or in the repository."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ttt_pipeline.config import PipelineConfig, load_config
from ttt_pipeline.io.tracking import Tracker, redact

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ["ttt_pipeline"]
SKIP_DIRS = {".venv", ".git", ".cache", ".hypothesis", ".pytest_cache", "mlruns", "__pycache__", "node_modules",
             "test-output", ".artifacts", ".prefect", ".run", ".whl", "build", "dist", ".ruff_cache",
             ".import_linter_cache"}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def _calls(attr: str):
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr:
                yield path, node


def _kw(node: ast.Call, name: str):
    return next((k.value for k in node.keywords if k.arg == name), None)


def test_every_from_pretrained_passes_the_config_flag_or_false():
    calls = list(_calls("from_pretrained"))
    assert len(calls) >= 4  # tokenizer and model at load, both again when a saved model is read back
    for path, node in calls:
        where = f"{path.relative_to(REPO)}:{node.lineno}"
        v = _kw(node, "trust_remote_code")
        assert v is not None, f"{where}: from_pretrained without trust_remote_code="
        ok = (isinstance(v, ast.Constant) and v.value is False) or \
             (isinstance(v, ast.Name) and v.id == "trust_remote_code") or \
             (isinstance(v, ast.Attribute) and v.attr == "trust_remote_code")
        assert ok, f"{where}: trust_remote_code must be False or the config flag, got {ast.unparse(v)}"


def test_trust_remote_code_is_off_by_default_and_flows_from_config():
    assert PipelineConfig().model.trust_remote_code is False
    src = (REPO / "ttt_pipeline" / "modeling" / "model.py").read_text()
    assert "load_pretrained(model_cfg.name, model_cfg.trust_remote_code)" in src


def test_every_torch_load_is_weights_only():
    calls = [(p, n) for p, n in _calls("load")
             if isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"]
    assert calls
    for path, node in calls:
        v = _kw(node, "weights_only")
        assert isinstance(v, ast.Constant) and v.value is True, f"{path.relative_to(REPO)}:{node.lineno}"


def test_no_unsafe_deserialisers_in_the_package():
    banned = {("pickle", "load"), ("pickle", "loads"), ("yaml", "load"), ("yaml", "unsafe_load"),
              ("dill", "load"), ("dill", "loads"), ("cloudpickle", "loads")}
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name):
                assert (node.func.value.id, node.func.attr) not in banned, f"{path}:{node.lineno}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in {"eval", "exec"}, f"{path}:{node.lineno}"


PASSWORD = "s3cr" + "et-pw"  # assembled at run time, so the repository scan below does not flag this file


@pytest.mark.parametrize("uri,shown", [
    (f"http://alice:{PASSWORD}@mlflow.example:5000", "http://alice:***@mlflow.example:5000"),
    (f"https://bob:{PASSWORD}@host/path?x=1", "https://bob:***@host/path?x=1"),
    (f"postgresql://u:{PASSWORD}@db:5432/mlflow", "postgresql://u:***@db:5432/mlflow"),
    (f"https://host/api?token={PASSWORD}&x=2", "https://host/api?token=***&x=2"),
    ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("hf://glue:sst2", "hf://glue:sst2"),
])
def test_redact(uri, shown):
    assert redact(uri) == shown


def test_password_in_tracking_uri_is_masked_in_params():
    cfg = load_config(None, [f"tracking.tracking_uri=http://alice:{PASSWORD}@mlflow.example:5000"])
    flat = cfg.flat()
    assert flat["tracking.tracking_uri"] == "http://alice:***@mlflow.example:5000"
    assert not any(PASSWORD in v for v in flat.values())

    class Client:
        logged: list = []

        def log_batch(self, run_id, params=(), **kw):
            self.logged += list(params)

    t = Tracker("http://127.0.0.1:1", "x")  # an http client connects lazily; the fake replaces it
    t.client = Client()
    t.params("run", {"tracking_uri": f"http://alice:{PASSWORD}@h", "plain": "value"})  # even if given raw
    assert {p.key: p.value for p in t.client.logged} == {"tracking_uri": "http://alice:***@h", "plain": "value"}
    assert PASSWORD not in Tracker(f"http://alice:{PASSWORD}@h:1", "x").ui_command()


SECRET_PATTERNS = {
    "credentials in a URL": re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@'\"{}]+:(?!\*\*\*@)(?!PASSWORD@)[^\s/@'\"{}<>]{3,}@"),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"),
    "password assignment": re.compile(r"(?i)\b(password|passwd|secret|api_key|token)\s*[:=]\s*['\"][^'\"\s]{6,}['\"]"),
}


def _repo_files():
    for p in REPO.rglob("*"):
        rel = p.relative_to(REPO)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts) or not p.is_file():
            continue
        if p.name in {"mlflow.db"} or p.suffix in {".db", ".pt", ".parquet", ".safetensors", ".png", ".whl"}:
            continue
        if p.stat().st_size > 2_000_000:
            continue
        yield rel, p


def test_no_secrets_in_the_repository():
    hits = []
    for rel, p in _repo_files():
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for what, pattern in SECRET_PATTERNS.items():
            for m in pattern.finditer(text):
                hits.append(f"{rel}: {what}: {m.group(0)[:40]}")
    assert not hits, "\n".join(hits)
    ignored = (REPO / ".gitignore").read_text().split()
    assert ".env" in ignored and "mlflow.db" in ignored  # local secrets and run data never get committed
