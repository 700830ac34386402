"""anchored_tta_views: the no-gradient control of `anchored_tta`: the same views, their predictions averaged.

Each review's class probabilities under the source weights are averaged over the `ttt.anchored_tta.views` masked
views `anchored_tta` adapts on (same masker, rate, seed and draws), and nothing is updated. The two differ in the
weight update alone, so the gain of `anchored_tta` over this control is what its steps add to showing the model
the views. It shares anchored_tta's settings (`ttt.anchored_tta.views`, `.view_mask_rate`; `ttt.seed`); the
engine is `ViewAverage` in anchored_tta.py, next to the views it must match.
"""

from __future__ import annotations

from ttt_pipeline.defenses.anchored_tta import Settings, ViewAverage, mask_token
from ttt_pipeline.defenses.base import EngineSettings


def build(model, tokenizer, settings: EngineSettings, own: Settings) -> ViewAverage:
    """The registry's constructor: anchored_tta's views and settings, no update."""
    from ttt_pipeline.modeling.model import special_token_ids

    return ViewAverage(model, mask_token(tokenizer), special_token_ids(tokenizer), settings, own)
