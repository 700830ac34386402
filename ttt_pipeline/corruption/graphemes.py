"""Split text into user-perceived characters before editing it.

Code-point edits can strand a combining accent, cut an emoji ZWJ sequence or
split a flag; treating a base character plus its extenders as one unit keeps
every corrupted text well-formed.  ASCII text (the common case) skips all of
this and is just ``list(text)``.
"""

from __future__ import annotations

import unicodedata

__all__ = ["units"]

_ZWJ = "\u200d"


def _extends(ch: str) -> bool:
    """True for code points that belong to the unit before them."""
    cp = ord(ch)
    if ch == _ZWJ or 0xFE00 <= cp <= 0xFE0F or 0x1F3FB <= cp <= 0x1F3FF:
        return True
    if 0xE0020 <= cp <= 0xE007F or 0xE0100 <= cp <= 0xE01EF:
        return True
    return unicodedata.category(ch) in ("Mn", "Me", "Mc")


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def units(text: str) -> list[str]:
    """Approximate grapheme clusters; joining them gives ``text`` back exactly."""
    if text.isascii():
        return list(text)
    out: list[str] = []
    glue = False  # previous code point was a ZWJ: the next one joins too
    for ch in text:
        if out and (glue or _extends(ch) or (
                _is_regional(ch) and len(out[-1]) == 1 and _is_regional(out[-1]))):
            out[-1] += ch
        else:
            out.append(ch)
        glue = ch == _ZWJ
    return out
