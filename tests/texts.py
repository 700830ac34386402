"""Review sentences several test modules share (a plain module: a test importing a folder's conftest would
shadow bench/defenses.py and the like)."""

# A long review, a short one, a middling one and one word: uneven lengths, so a batch of them pads.
REVIEWS = ["the battery died after two days and support never answered my emails",
           "great little speaker , loud and clear",
           "it works as described . the cable is a bit short but fine for the price overall",
           "terrible"]
