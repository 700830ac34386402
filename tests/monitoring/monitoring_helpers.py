"""Constants shared by the monitoring tests."""

LABELS = ["neg", "mixed", "pos"]
TEXTS = [
    "The battery lasts all day and the sound is clear, I would buy this speaker again for the kitchen.",
    "Stopped working after two weeks, the charger gets hot and customer service never answered my emails.",
    "It is fine for the price, a bit flimsy, but the screen is bright and the setup took five minutes.",
    "Terrible keyboard, keys stick and the letters wore off within a month of light use at the office.",
    "Great headphones: comfortable, light, good bass, and the noise cancelling works on the train too.",
]

# The clean test set's window (descriptors.window_descriptors' keys the forecast reads)
CLEAN = {"repaired_words_share": 0.01, "oov_words_share": 0.05, "non_letter_character_share": 0.04,
         "mean_confidence": 0.9}
SLOPE = 0.8  # the synthetic dose-response: accuracy lost per unit of excess repaired_words_share


def calibration(seed: int = 0):
    """A calibration fitted on synthetic corrupted sets: five families, five severities, drop ~ SLOPE x the
    excess share of repaired words with a little noise, so the held-out interval has a width."""
    import numpy as np

    from ttt_pipeline.evaluation.forecast import CalibrationPoint, CleanReference, fit_calibration

    rng = np.random.default_rng(seed)
    points = []
    for fam in ("keyboard", "ocr", "char_drop", "misspelling", "case"):
        for sev in range(1, 6):
            rws = 0.03 * sev
            window = {**CLEAN, "repaired_words_share": CLEAN["repaired_words_share"] + rws,
                      "mean_confidence": 0.9 - 0.5 * rws}
            drop = SLOPE * rws * (1 + 0.05 * rng.standard_normal())
            points.append(CalibrationPoint(fam, sev, window, accuracy=0.9 - drop, drop=drop))
    return fit_calibration(points, CleanReference(CLEAN, 0.9, np.linspace(0.6, 1.0, 50)))


def payload(seed: int = 0, label_names=("neg", "pos")) -> dict:
    """What the calibration store returns for a model version: the calibration and its reference."""
    return {"calibration": calibration(seed).to_dict(),
            "reference": {**CLEAN, "label_shares": [0.5, 0.5], "label_names": list(label_names),
                          "test_accuracy": 0.9, "n": 50}, "sets": []}
