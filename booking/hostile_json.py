"""JSON uploaded by a stranger, loaded within bounds (`load_json`): at most `max_bytes` bytes of UTF-8, nested at
most MAX_DEPTH levels (counted in one linear pass before json.loads recurses), integers of at most MAX_INT_DIGITS
digits, no NaN or Infinity, no key twice in an object. What is refused raises the report framework's
`InvalidReport` (booking/report_schema.py) with its code: too_large, not_json or too_deep, bad_number. Pure:
standard library only.
"""

import json
import math
import re

from booking.report_schema import InvalidReport

MAX_DEPTH = 32
MAX_INT_DIGITS = 16
_SPECIAL = re.compile(r'[\[\]{}"\\]')


def _depth(text: str) -> int:
    """Nesting depth of JSON text, strings skipped: one linear pass over the special characters, no recursion
    (json.loads recurses) and no backtracking regex over hostile strings."""
    depth = deepest = 0
    in_string = False
    skip_until = -1
    for match in _SPECIAL.finditer(text):
        position, char = match.start(), match.group()
        if position < skip_until:
            continue
        if in_string:
            if char == "\\":
                skip_until = position + 2  # the escaped character
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _refuse_constant(name: str):
    raise InvalidReport("bad_number", f"{name} is not a number a report may carry")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise InvalidReport("bad_number", f"an integer of {len(text)} digits is too large")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidReport("bad_number", "a number overflows to infinity")
    return value


def _no_duplicates(pairs: list) -> dict:
    result = {}
    for key, value in pairs:
        if key in result:
            raise InvalidReport("not_json", "a key appears twice in the same object")
        result[key] = value
    return result


def load_json(raw, max_bytes: int):
    """The JSON document in `raw` (the uploaded bytes), or InvalidReport with its code."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise InvalidReport("not_json", f"expected the uploaded bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    if len(raw) > max_bytes:
        raise InvalidReport("too_large", f"the report is {len(raw)} bytes; the limit is {max_bytes}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidReport("not_json", "the report is not UTF-8 text") from None
    if _depth(text) > MAX_DEPTH:
        raise InvalidReport("too_deep", f"the report nests deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
            object_pairs_hook=_no_duplicates,
        )
    except RecursionError:
        raise InvalidReport("too_deep", "the report nests too deeply") from None
    except ValueError as exc:
        if isinstance(exc, InvalidReport):
            raise
        raise InvalidReport("not_json", f"the report is not valid JSON ({exc})") from None
