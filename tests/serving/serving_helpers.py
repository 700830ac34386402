"""Constants shared by the serving tests."""

LABELS = ["neg", "mixed", "pos"]
# Long enough that masked TTT masks tokens of each (mask_prob 0.1 on a handful of words masks none).
TEXTS = [
    "The battery lasts all day and the sound is clear, I would buy this speaker again for the kitchen.",
    "Stopped working after two weeks, the charger gets hot and customer service never answered my emails.",
    "It is fine for the price, a bit flimsy, but the screen is bright and the setup took five minutes.",
    "Terrible keyboard, keys stick and the letters wore off within a month of light use at the office.",
    "Great headphones: comfortable, light, good bass, and the noise cancelling works on the train too.",
]


def same_predictions(a: list[dict], b: list[dict], tol: float = 1e-5) -> bool:
    """Equal labels and class probabilities within `tol` (another batch composition pads differently, which
    moves float32 results in the last digits)."""
    return len(a) == len(b) and all(
        x["label"] == y["label"] and list(x["probabilities"]) == list(y["probabilities"])
        and all(abs(x["probabilities"][k] - y["probabilities"][k]) <= tol for k in x["probabilities"])
        for x, y in zip(a, b))
