"""One training step and one scoring batch, timed and profiled by operator group, for bench/speed.py.

Training step arms, on the same batch (the recipe's batch size at its mean padded width), alternated round by round:
- `before`: the recipe as it trained before the CPU work: AdamW over a loop of per-tensor kernels (not fused) and the
  checkpoint's hidden dropout;
- `after`: the recipe as the library trains it now (fused AdamW, `finetune.hidden_dropout` as the preset sets it);
- `no_dropout`: `after` with hidden dropout 0 too, where `after` still draws it (what dropout's masks cost).
Each arm's `of_gemm` is its matmul GFLOP/s (torch's FlopCounterMode on the batch) over the sustained GEMM rate in its
precision. The profile (torch.profiler, self CPU time of aten operators) splits one `after` step and one scoring batch
into matrix products, dropout, optimizer, attention, and norms/elementwise (the rest).
"""

from __future__ import annotations

import copy
import statistics
import time
from contextlib import ExitStack

import torch

GROUPS = (("matrix products", ("addmm", "aten::mm", "bmm", "matmul", "linear")),
          ("dropout", ("bernoulli", "dropout")),
          ("optimizer", ("adam", "_foreach_")),
          ("attention", ("softmax", "scaled_dot_product", "attention")))


def group_of(op: str) -> str:
    name = op.lower()
    return next((g for g, keys in GROUPS if any(k in name for k in keys)), "norms/elementwise")


def operator_groups(fn) -> dict:
    """Each group's share of the aten operators' self CPU time while `fn()` runs, and the total in ms."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    times: dict[str, float] = {}
    for e in prof.key_averages():
        if e.key.startswith("aten::"):
            times[group_of(e.key)] = times.get(group_of(e.key), 0.0) + e.self_cpu_time_total
    total = sum(times.values()) or 1.0
    return {"total_ms": round(total / 1000, 1), **{g: round(t / total, 3) for g, t in
                                                   sorted(times.items(), key=lambda kv: -kv[1])}}


def _batch(tok, texts: list[str], labels: list[int], width: int, size: int):
    pick = sorted(range(len(texts)), key=lambda i: -len(texts[i]))[:size]
    enc = tok([texts[i] for i in pick], truncation=True, max_length=width, padding="max_length", return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"], torch.tensor([labels[i] for i in pick])


class StepArm:
    """A copy of the model, its optimizer and the recipe's loss, stepping under one arm's settings."""

    def __init__(self, model, tok, ft, runtime, fused: bool, hidden_dropout: float | None):
        from ttt_pipeline.modeling.train import TrainingLoss, joint_training

        self.model = copy.deepcopy(model).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=ft.lr, fused=fused)
        self.loss = TrainingLoss(self.model, tok, ft, joint_training(ft), runtime.train.dtype,
                                 torch.Generator().manual_seed(0), None)
        self.ft, self.runtime, self.hidden_dropout = ft, runtime, hidden_dropout

    def step(self, ids, am, y) -> None:
        from ttt_pipeline.modeling.train import (
            training_attention,
            training_attention_dropout,
            training_hidden_dropout,
        )

        with ExitStack() as stack:
            stack.enter_context(training_attention(self.model, self.runtime.attention))
            stack.enter_context(training_attention_dropout(self.model, self.ft.attention_dropout))
            stack.enter_context(training_hidden_dropout(self.model, self.hidden_dropout))
            self.loss(ids, am, y)[0].backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)


def train_gflop_per_sample(model, loss_fn, n: int) -> float:
    """Matmul GFLOP of one sample's forward and backward: torch's FlopCounterMode over `loss_fn()` and its
    backward on a batch of `n`; the gradients are dropped after."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss_fn().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / n / 1e9


def step_figures(trained, data: dict, width: int, gemm: dict, args) -> dict:
    """Median step time, samples/s and of_gemm of each arm; the speedups over `before`; the operator groups of
    one `after` step and one scoring batch."""
    from ttt_pipeline.modeling.precision import resolve_runtime

    model, tok, cfg = trained
    ft = cfg.finetune
    runtime = resolve_runtime(args.device, ft.precision, cfg.ttt.precision, ft.attention)
    ids, am, y = _batch(tok, *data["train"], width, ft.batch_size)
    arms = {"before": StepArm(model, tok, ft, runtime, False, None),
            "after": StepArm(model, tok, ft, runtime, True, ft.hidden_dropout)}
    if ft.hidden_dropout != 0:
        arms["no_dropout"] = StepArm(model, tok, ft, runtime, True, 0.0)
    times: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(args.repeats + 1):  # round 0 warms up (kernels chosen, optimizer state allocated)
        for name, arm in arms.items():
            t0 = time.perf_counter()
            arm.step(ids, am, y)
            if r:
                times[name].append(time.perf_counter() - t0)
    after = arms["after"]
    gflop = train_gflop_per_sample(after.model, lambda: after.loss(ids, am, y)[0], len(y))
    rate = gemm["bfloat16" if runtime.train.name == "bf16" else "float32"]
    out = {"batch": list(ids.shape), "gflop_per_sample": round(gflop, 3), "arms": {}}
    for name, ts in times.items():
        per_s = len(y) / statistics.median(ts)
        out["arms"][name] = {"step_ms": round(1000 * statistics.median(ts), 1), "samples_per_s": round(per_s, 2),
                             "of_gemm": round(per_s * gflop / rate, 3)}
    base = out["arms"]["before"]["step_ms"]
    out["speedup_over_before"] = {a: round(base / f["step_ms"], 3) for a, f in out["arms"].items() if a != "before"}
    out["profile_step"] = operator_groups(lambda: after.step(ids, am, y))
    out["profile_scoring"] = scoring_profile(model, tok, data, width, runtime, cfg)
    return out


def scoring_profile(model, tok, data: dict, width: int, runtime, cfg) -> dict:
    """One plain scoring batch (`ttt.batch_size` test reviews), as the pipeline scores: inference mode, the run's
    scoring precision."""
    ids, am, _ = _batch(tok, *data["test"], width, cfg.ttt.batch_size)
    model.eval()

    def forward():
        with torch.inference_mode(), torch.autocast(runtime.device.type, dtype=runtime.score.dtype,
                                                    enabled=runtime.score.dtype is not None):
            model(ids, am)

    forward()
    return operator_groups(forward)
