"""Label values (ints, floats such as MDSD's 4.0, strings) -> contiguous class ids, with a saved mapping."""

from __future__ import annotations

import math
from typing import Any, Iterable

from ttt_pipeline.errors import DataError


def safe_str(value: Any) -> str:
    """str() that cannot fail: ints past Python's 4300-digit limit become hex."""
    try:
        return str(value)
    except ValueError:
        return hex(value) if isinstance(value, int) else repr(type(value))


def canonical(value: Any) -> str | None:
    """One spelling per label: 4, 4.0 and "4.0" are all "4"; missing values are None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)) or hasattr(value, "item"):
        try:
            f = float(value)
        except OverflowError:  # an int beyond float range (10**400) is still one exact label
            return safe_str(value)
        except (TypeError, ValueError, RuntimeError):  # arrays / tensors of several values
            return safe_str(value).strip() or None
        return str(int(f)) if f.is_integer() else repr(f)
    text = safe_str(value).strip().encode("utf-8", "backslashreplace").decode("utf-8")  # no lone surrogates
    if not text:
        return None
    try:
        f = float(text)
    except ValueError:
        return text
    return str(int(f)) if math.isfinite(f) and f.is_integer() else text


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def infer_label_names(values: Iterable[str], where: str) -> list[str]:
    uniq = sorted(set(values))
    numeric = [v for v in uniq if _is_number(v)]
    if numeric and len(numeric) != len(uniq):
        other = [v for v in uniq if not _is_number(v)][:3]
        raise DataError(f"{where}: labels of mixed types (numbers {numeric[:3]} and text {other})",
                        "make the label column consistent, or list the classes in data.label_names")
    if numeric:
        return sorted(uniq, key=float)
    return uniq


def encode(values: list[str], names: list[str], where: str) -> list[int]:
    index = {n: i for i, n in enumerate(names)}
    bad = sorted({v for v in values if v not in index})
    if bad:
        if len(bad) == len(set(values)):  # no label matches: the classes were written for other data (a preset's)
            hint = (f"run with `--set data.label_names=null` to take the classes from the data ({len(bad)} values: "
                    f"{', '.join(bad[:8])}{', ...' if len(bad) > 8 else ''}), or list them in the order you want "
                    "in data.label_names")
        else:
            hint = ("fix those rows, add the values to data.label_names, or run with `--set data.label_names=null` "
                    "to take the classes from the data")
        raise DataError(f"{where}: labels {bad[:5]} are outside the classes {names}", hint)
    return [index[v] for v in values]
