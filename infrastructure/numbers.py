"""Whole numbers typed by people or sent by browsers: only ASCII digits count.

`str.isdigit()` is true for "²" and "٣", which `int()` refuses or reads as another number; every form field,
query parameter and setting that names an id, a chain or a count goes through `whole_number` instead.
"""

import re

_DIGITS = re.compile(r"[0-9]+")


def whole_number(value: str | None, *, max_digits: int = 12) -> int | None:
    """`value` as an int when it is 1 to `max_digits` ASCII digits, else None."""
    if value is None or len(value) > max_digits or not _DIGITS.fullmatch(value):
        return None
    return int(value)
