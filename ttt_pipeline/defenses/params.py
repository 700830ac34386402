"""Which parameters test-time adaptation touches, their optimizer, and an in-place restore.

Kept apart from the engines so that the masked-TTT and Tent engines share one definition of "restore":
the adapted buffer is refilled in place from the model's own, never-modified tensors (no deepcopy of the model,
no stored copy of the weights) and the optimizer state is dropped, to be allocated again by the next step.
"""

from __future__ import annotations

import torch
from torch import nn

PARAM_SELECTIONS = ("all", "layernorm", "top_k", "bias", "lower_norm")
OPTIMIZERS = ("adam", "adamw", "sgd")


def _dedup(params) -> list[nn.Parameter]:
    # Tied weights (the MLM decoder shares the word embeddings) must appear once in an optimizer.
    seen: set[int] = set()
    return [p for p in params if not (id(p) in seen or seen.add(id(p)))]


def encoder_layers(model) -> list[nn.Module]:
    """The transformer blocks of model.encoder (BERT/RoBERTa `encoder.layer`, DistilBERT `transformer.layer`)."""
    enc = model.encoder
    for path in ("encoder.layer", "transformer.layer", "layers", "layer"):
        obj = enc
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if isinstance(obj, (nn.ModuleList, nn.Sequential, list)):
            return list(obj)
    raise ValueError(f"{type(enc).__name__}: cannot find its transformer layers for params=top_k")


def layernorm_parameters(model) -> list[nn.Parameter]:
    """Affine weights and biases of every LayerNorm inside the encoder (not the heads)."""
    return _dedup(p for m in model.encoder.modules() if isinstance(m, nn.LayerNorm)
                  for p in m.parameters(recurse=False))


def lower_norm_parameters(model, lower_k: int | None = None) -> list[nn.Parameter]:
    """LayerNorm affine parameters and biases of the lowest `lower_k` encoder layers (default: the lower half,
    rounded up) plus the embeddings' LayerNorm: the parameters SAR (Niu et al. 2023) finds safe to adapt, the
    top layers' being the ones whose adaptation collapses."""
    layers = encoder_layers(model)
    k = (len(layers) + 1) // 2 if lower_k is None else int(lower_k)
    if not 1 <= k <= len(layers):
        raise ValueError(f"lower_k must be in 1..{len(layers)} (the encoder's layers), got {lower_k}")
    below = [m for m in model.encoder.modules() if isinstance(m, nn.LayerNorm)
             and not any(m is n for layer in layers for n in layer.modules())]  # the embeddings' LayerNorm
    chosen = [p for m in below for p in m.parameters(recurse=False)]
    for layer in layers[:k]:
        chosen += [p for n, p in layer.named_parameters() if n.endswith("bias")]
        chosen += [p for m in layer.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters(recurse=False)]
    return _dedup(chosen)


def select_parameters(model, which: str, top_k: int = 2) -> list[nn.Parameter]:
    """The parameters TTT adapts.

    all: every parameter of the model (as torch-ttt does; the classification head gets no gradient from
    the MLM loss, so Adam leaves it alone); layernorm: encoder LayerNorm affine parameters; top_k: every
    parameter of the last `top_k` encoder layers; bias: every bias of the encoder (BitFit-style);
    lower_norm: LayerNorm affine parameters and biases of the lower half of the encoder layers (and the
    embeddings' LayerNorm, see lower_norm_parameters).
    """
    if which == "all":
        return _dedup(model.parameters())
    if which == "layernorm":
        return layernorm_parameters(model)
    if which == "bias":
        return _dedup(p for n, p in model.encoder.named_parameters() if n.endswith("bias"))
    if which == "top_k":
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        layers = encoder_layers(model)
        return _dedup(p for layer in layers[-top_k:] for p in layer.parameters())
    if which == "lower_norm":
        return lower_norm_parameters(model)
    raise ValueError(f"unknown parameter selection {which!r}; choose from {PARAM_SELECTIONS}")


def make_optimizer(params, name: str, lr: float, momentum: float = 0.0) -> torch.optim.Optimizer:
    """Adam/AdamW, or SGD (without momentum unless `momentum` > 0); the fused kernel where torch has one."""
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}.get(name)
    if cls is None:
        raise ValueError(f"unknown optimizer {name!r}; choose from {OPTIMIZERS}")
    if momentum and name != "sgd":
        raise ValueError(f"momentum is an SGD setting; optimizer {name!r} has its own moments")
    kw = {"momentum": momentum} if momentum else {}
    params = list(params)
    if params and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params):
        try:
            return cls(params, lr=lr, fused=True, **kw)
        except (RuntimeError, TypeError, ValueError):
            pass
    return cls(params, lr=lr, **kw)


def drop_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Free the optimizer's state (Adam's moments and step counters, SGD's momentum): its next step is then a
    fresh optimizer's first step, bit for bit. Why freed rather than zeroed in place: with several steps per unit
    the next unit would otherwise carry two weight-sized moment buffers (about 180 MB for MiniLM-L6 with
    params=all) through its first forward and backward pass, where the activations peak."""
    opt.state.clear()


SLICE_NUMEL = 1 << 20  # 4 MB of fp32 per slice: Adam's moments for one slice are 8 MB, reused from the heap


def fresh_step_in_slices(opt: torch.optim.Optimizer, numel: int = SLICE_NUMEL) -> None:
    """A fresh optimizer's first step, taken a slice of each parameter at a time, the state dropped after each.

    Why: with one step per episode the optimizer's state lives for that step only. Taken whole, Adam allocates
    two weight-sized moments at once (about 180 MB for MiniLM-L6 with params=all), and that step was evaluate's memory
    peak. The update is elementwise, so the slices give the whole step's numbers bit for bit (tests); torch.optim
    has no such option, hence the one param group pointed at each slice in turn."""
    if opt.state:
        raise ValueError("fresh_step_in_slices: the optimizer holds state; a sliced step must be a first step")
    (group,) = opt.param_groups
    params = group["params"]
    try:
        for p in params:
            if p.grad is None:
                continue
            values, grad = p.data.view(-1), p.grad.view(-1)
            for start in range(0, values.numel(), numel):
                piece = nn.Parameter(values[start:start + numel])  # shares the buffer's storage
                piece.grad = grad[start:start + numel]
                group["params"] = [piece]
                opt.step()
                opt.state.clear()
    finally:
        group["params"] = params


class FlatParams:
    """The adapted parameters as views into one contiguous buffer per (device, dtype), while attached.

    Why: a step then touches ONE tensor instead of ~150 (fused Adam and restore are one kernel each; a sliced
    first step one per 4 MB slice). On a busy CPU every kernel is a parallel region whose threads may have to
    wait to be scheduled, so the number of kernels, not the bytes, is what costs there.

    attach() points each parameter's storage at its slice of the buffer (a metadata swap, no copy) and
    detach() points it back at its own, untouched tensor: in episodic use the model leaves `predict` with its
    original storage and values whatever happened in between. restore() refills the buffer from those
    originals (one `torch.cat` per group into the buffer; no second copy of the weights is kept). The optimizer
    works on `self.flat` (one Parameter per group); bind_grads() makes each parameter's `.grad` a view into
    its group's zeroed `.grad`, so the backward pass accumulates into the optimizer's gradient in place (no
    gradient tensor per parameter, no gather). A parameter that gets no gradient keeps zeros: Adam and SGD leave
    it as it is, as torch.optim does; AdamW would decay it (torch.optim skips it), so engines leave out what
    cannot get one.
    """

    def __init__(self, params: list[nn.Parameter]):
        self.params = list(params)
        self.original = [p.data for p in self.params]
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(self.params):
            groups.setdefault((p.device, p.dtype), []).append(i)
        self.groups = list(groups.values())
        self.flat: list[nn.Parameter] = []
        self.views: list[torch.Tensor | None] = [None] * len(self.params)
        self.grad_views: list[torch.Tensor | None] = [None] * len(self.params)
        for idx in self.groups:
            with torch.no_grad():
                flat = nn.Parameter(self._originals(idx))
            self.flat.append(flat)
            for i, view in zip(idx, self._split(flat.data, idx)):
                self.views[i] = view
        self.attached = False

    def _split(self, buf: torch.Tensor, idx: list[int]) -> list[torch.Tensor]:
        sizes = [self.original[i].numel() for i in idx]
        return [v.view_as(self.original[i]) for i, v in zip(idx, buf.split(sizes))]

    def _originals(self, idx: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """The group's original values, flat, in one kernel (into `out` when given)."""
        return torch.cat([self.original[i].reshape(-1) for i in idx], out=out)

    def source_values(self) -> list[torch.Tensor]:
        """The source values, flat per group (a fresh copy each call: for diagnostics and tests)."""
        return [self._originals(idx) for idx in self.groups]

    def attach(self) -> None:
        if not self.attached:
            for p, v in zip(self.params, self.views):
                p.data = v
            self.attached = True

    def detach(self) -> None:
        if self.attached:
            for p, o in zip(self.params, self.original):
                p.data = o
            self.attached = False

    @torch.no_grad()
    def restore(self) -> None:
        """Buffer := the original values (one kernel per group)."""
        for idx, flat in zip(self.groups, self.flat):
            self._originals(idx, out=flat.data)

    @torch.no_grad()
    def bind_grads(self) -> None:
        """Zero each group's gradient (allocated once) and make every parameter's `.grad` its view into it: the
        backward pass then adds into the optimizer's gradient in place (autograd accumulates into a defined
        `.grad`), which is what a gather of per-parameter gradients gave, without their memory or the copy."""
        for idx, flat in zip(self.groups, self.flat):
            if flat.grad is None:
                flat.grad = torch.zeros_like(flat.data)
                for i, view in zip(idx, self._split(flat.grad, idx)):
                    self.grad_views[i] = view
            else:
                flat.grad.zero_()
        for p, g in zip(self.params, self.grad_views):
            p.grad = g

    def unbind_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def changed(self) -> list[int]:
        """Indices of the parameters whose current values differ from the originals (tests, diagnostics)."""
        return [i for i, (p, o) in enumerate(zip(self.params, self.original)) if not torch.equal(p.data, o)]
