"""Import torch-ttt 0.0.2 (a test/bench-only reference) without torchvision or einops.

torch-ttt imports every engine when any engine module is imported (its registry walks the folder), and the
vision engines import torchvision and einops at module level. Neither has a CPU build here and none of
their code runs for MaskedTTTEngine, so stand-in modules go into sys.modules first (only when the real
package is missing). The product (ttt_pipeline) never imports torch-ttt.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types


def _stub(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    mod.__torch_ttt_stub__ = True
    sys.modules[name] = mod
    return mod


def _unavailable(*_a, **_k):
    raise RuntimeError("stand-in module: torchvision/einops are not installed (torch-ttt shim)")


def install() -> None:
    """Put stand-ins for torchvision(.transforms(.functional)) and einops into sys.modules if missing."""
    if "torchvision" not in sys.modules and importlib.util.find_spec("torchvision") is None:
        functional = _stub("torchvision.transforms.functional", rotate=_unavailable,
                           resized_crop=_unavailable, gaussian_blur=_unavailable)
        transforms = _stub("torchvision.transforms", functional=functional, Compose=_unavailable,
                           RandomHorizontalFlip=_unavailable, RandomRotation=_unavailable,
                           RandomAffine=_unavailable, RandomGrayscale=_unavailable,
                           RandomApply=_unavailable, GaussianBlur=_unavailable)
        _stub("torchvision", transforms=transforms)
    if "einops" not in sys.modules and importlib.util.find_spec("einops") is None:
        _stub("einops", rearrange=_unavailable)


def masked_ttt_engine_class():
    """torch_ttt.engine.masked_ttt_engine.MaskedTTTEngine, imported behind the stand-ins."""
    install()
    return importlib.import_module("torch_ttt.engine.masked_ttt_engine").MaskedTTTEngine


def reference_wrapper(model):
    """The tutorial's model shape for torch-ttt: forward(input_ids, attention_mask) -> class logits, with the
    MLM head run on every position inside forward so that torch-ttt's hook on `mlm_head` sees full
    vocabulary logits (torch-ttt reads its features from a hooked module). Hook name: "clf.mlm_head"."""
    import torch

    class TutorialModel(torch.nn.Module):
        def __init__(self, clf):
            super().__init__()
            self.clf = clf

        def forward(self, input_ids, attention_mask):
            hidden = self.clf.encode(input_ids, attention_mask)
            self.clf.mlm_head(hidden)  # full-vocabulary MLM logits, captured by torch-ttt's forward hook
            return self.clf.classify_hidden(hidden, attention_mask)

    return TutorialModel(model)
