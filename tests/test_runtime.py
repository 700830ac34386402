"""One place decides the machine choices (device, fine-tuning and scoring precision, attention): `resolve_runtime`.
The pipeline resolves it once per configuration (`steps.runtime`), a Classifier once per precision, and every layer
below receives the result: fine-tuning, the plain forward pass and the test-time engines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from ttt_pipeline.modeling import precision

PACKAGE = Path(precision.__file__).resolve().parents[1]
RESOLVERS = {"resolve_precision", "resolve_attention", "cpu_native_bf16", "autocast_dtype"}
# the one resolver, and the pipeline's key for its memo (the CPU's verdict, not a choice)
ALLOWED = {("modeling/precision.py", "resolve_precision"), ("modeling/precision.py", "resolve_attention"),
           ("modeling/precision.py", "cpu_native_bf16"), ("steps/machine.py", "cpu_native_bf16")}


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names & RESOLVERS


def test_only_the_runtime_resolver_asks_the_machine():
    found = {(str(p.relative_to(PACKAGE)), name) for p in PACKAGE.rglob("*.py") for name in _calls(p)}
    assert found - ALLOWED == set(), "resolve the machine choices with modeling.precision.resolve_runtime"


def test_the_pipeline_resolves_once_per_configuration(monkeypatch):
    from ttt_pipeline import steps
    from ttt_pipeline.config import PipelineConfig
    from ttt_pipeline.storage import StepOutput

    calls = []
    real = precision.resolve_runtime
    monkeypatch.setattr(precision, "resolve_runtime", lambda *a, **k: calls.append(a) or real(*a, **k))
    steps.machine._runtime.cache_clear()
    cfg = PipelineConfig().model_copy(deep=True)
    cfg.finetune.device = "cpu"
    up = StepOutput(step="x", key="k", path="x", digest="d", cached=True, meta={"sets": {}})
    steps.finetune_inputs(cfg, up, up)
    steps.evaluate_inputs(cfg, up, up, up)
    steps.attribute_inputs(cfg, up, up, up, [])
    steps.runtime(cfg.model_copy(deep=True))  # an equal configuration: the same decision
    assert len(calls) == 1
    machine = steps.runtime(cfg)
    assert (machine.device.type, machine.train.name, machine.score.name) == ("cpu", "fp32", "fp32")  # conftest CPU


def test_fine_tuning_takes_the_runtime_it_is_given(monkeypatch, make_tiny_clf, tmp_path):
    """Given a Runtime, fine-tuning resolves nothing: it trains under the given precision (here bf16, forced on a
    CPU the tests treat as having none)."""
    from datasets import Dataset

    from ttt_pipeline.config import FinetuneConfig
    from ttt_pipeline.modeling import train

    given = precision.Runtime(torch.device("cpu"), precision.Precision("bf16", "given"),
                              precision.Precision("fp32", "given"), precision.Attention(None, "given"))
    monkeypatch.setattr(train, "resolve_runtime", lambda *a, **k: pytest.fail("fine-tuning resolved again"))
    seen = []
    real = torch.autocast

    def spy(device_type, dtype=None, **kw):
        seen.append(dtype)
        return real(device_type, dtype=dtype, **kw)

    monkeypatch.setattr(train.torch, "autocast", spy)
    model, tok = make_tiny_clf(("a", "b"))
    enc = tok(["good", "bad", "fine", "awful"], truncation=True, max_length=16)
    ds = Dataset.from_dict({"input_ids": enc["input_ids"], "label": [0, 1, 0, 1],
                            "length": [len(x) for x in enc["input_ids"]]})
    cfg = FinetuneConfig(epochs=1, batch_size=4, lr=1e-3, alignment="joint", joint_passes=1,
                         early_stopping_patience=0, seed=0, mlm_warmup_max_steps=0, device="cpu")
    train.finetune(model, tok, ds, None, cfg, tmp_path, runtime=given)
    assert seen and set(seen) == {torch.bfloat16}


def test_scoring_hands_its_precision_to_the_forward_pass_and_the_engines(monkeypatch, make_tiny_clf):
    from ttt_pipeline.config import TTTConfig
    from ttt_pipeline.defenses import registry
    from ttt_pipeline.evaluation import scoring

    model, tok = make_tiny_clf(("a", "b"))
    ttt = TTTConfig(methods=["none", "tent"])
    assert registry.build_engine("tent", model, tok, ttt, torch.bfloat16).amp is torch.bfloat16
    assert registry.build_engine("tent", model, tok, ttt).amp is None  # nothing given: fp32, never a guess
    seen = []
    real = scoring.predict
    monkeypatch.setattr(scoring, "predict", lambda *a, **k: seen.append((a[5], a[8])) or real(*a, **k))
    for method in ("none", "tent"):
        scoring.score_texts(model, tok, ["good", "bad"], method, ttt, 16, 2, amp=torch.bfloat16)
    plain, engine = seen
    assert plain == (None, torch.bfloat16)  # the plain pass autocasts
    assert engine[0].amp is torch.bfloat16 and engine[1] is None  # the engine autocasts itself


def test_a_classifier_decides_once_per_precision(monkeypatch, make_tiny_clf):
    from ttt_pipeline.classifier import Classifier

    calls = []
    real = precision.resolve_runtime
    monkeypatch.setattr(precision, "resolve_runtime", lambda *a, **k: calls.append(k) or real(*a, **k))
    model, tok = make_tiny_clf(("a", "b"))
    clf = Classifier(model, tok)
    clf.prepare()
    clf.predict(["good", "bad"])
    clf.predict(["fine"])
    assert len(calls) == 1
    clf.predict(["fine"], precision="fp32")
    assert [c["score_precision"] for c in calls] == ["auto", "fp32"]
