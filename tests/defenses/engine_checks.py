"""Helpers of the engine tests (imported by the test modules of this folder)."""

from __future__ import annotations

import torch


def snapshot(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def unchanged(model, before: list[torch.Tensor]) -> bool:
    return all(torch.equal(p, b) for p, b in zip(model.parameters(), before)) and all(
        p.grad is None for p in model.parameters())


def plain_logits(model, ids, am) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids, am).float().clone()
