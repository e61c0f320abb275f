"""A small schema framework for the JSON reports customers upload (booking/split_trial_report.py declares the
split-trial report with it): field kinds (`Number`, `Text`, `Choice`, `Flag`, `TextList`, `Object`, `Ranks`,
`ObjectList`) and `Cleaner`, which walks a parsed document against a declaration and returns a new dict holding
only the declared keys, with their types and bounds checked and text stripped of control characters (C0/C1, bidi
overrides, lone surrogates) and length-limited. Unknown keys are dropped and counted, never an error; markup is kept
as text and noted (`markup_seen`). What is refused raises `InvalidReport`, with a code of CODES and the path of the
offending field. Pure: standard library only.
"""

import math
import re
import unicodedata

CODES = (
    "too_large",
    "not_json",
    "too_deep",
    "wrong_schema",
    "missing_field",
    "bad_field",
    "bad_number",
    "bad_text",
    "bad_ranks",
)


class InvalidReport(ValueError):
    """A report the portal refuses; ``code`` is one of CODES, ``path`` the offending field ("" for the whole)."""

    def __init__(self, code: str, message: str, path: str = ""):
        super().__init__(message)
        self.code = code
        self.path = path
        self.message = message

    def __repr__(self) -> str:
        return f"InvalidReport(code={self.code!r}, path={self.path!r}, message={self.message!r})"


# --------------------------------------------------------------------------------------------------------------
# Field kinds
# --------------------------------------------------------------------------------------------------------------


class Number:
    def __init__(self, low: float = 0.0, high: float = 1e9, *, integer: bool = False, required: bool = True):
        self.low, self.high, self.integer, self.required = low, high, integer, required


class Text:
    def __init__(self, limit: int = 300, *, required: bool = True, multiline: bool = False):
        self.limit, self.required, self.multiline = limit, required, multiline


class Choice:
    def __init__(self, *choices: str, required: bool = True):
        self.choices, self.required = choices, required


class Flag:
    def __init__(self, *, required: bool = True):
        self.required = required


class TextList:
    def __init__(self, limit: int, min_items: int, max_items: int, *, required: bool = True):
        self.limit, self.min_items, self.max_items, self.required = limit, min_items, max_items, required


class Object:
    def __init__(self, fields: dict, *, required: bool = True):
        self.fields, self.required = fields, required


class Ranks:
    def __init__(self, fields: dict):
        self.fields, self.required = fields, True


class ObjectList:
    def __init__(self, fields: dict, min_items: int, max_items: int, *, required: bool = True):
        self.fields, self.min_items, self.max_items, self.required = fields, min_items, max_items, required


# C0 and C1 controls, DEL, bidi embeddings/overrides/isolates, zero-width and BOM, lone surrogates.
STRIP = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb\ud800-\udfff]"
)
SPACES = re.compile(r"[\t\n\r]+")
# Possessive `\s*+`: a `<` and a long run of spaces with no letter after it is one pass, not quadratic.
MARKUP = re.compile(r"<\s*+/?\s*+[A-Za-z!?]|&#?\w+;|javascript:", re.IGNORECASE)


class Cleaner:
    def __init__(self):
        self.markup_seen = False
        self.dropped = 0

    def number(self, kind: Number, value, path: str):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidReport("bad_number", f"{path} must be a number", path)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidReport("bad_number", f"{path} must be a finite number", path)
        if kind.integer:
            if isinstance(value, float):
                if not value.is_integer():
                    raise InvalidReport("bad_number", f"{path} must be a whole number", path)
                value = int(value)
        else:
            value = float(value)
        if not kind.low <= value <= kind.high:
            raise InvalidReport("bad_number", f"{path} must lie between {kind.low:g} and {kind.high:g}", path)
        return value

    def text(self, kind: Text, value, path: str) -> str:
        if not isinstance(value, str):
            raise InvalidReport("bad_text", f"{path} must be text", path)
        if len(value) > kind.limit * 2:  # before cleaning: a huge string of controls is refused too
            raise InvalidReport("bad_text", f"{path} is longer than {kind.limit} characters", path)
        value = SPACES.sub(" ", value)
        value = STRIP.sub("", value)
        value = unicodedata.normalize("NFC", value).strip()
        if len(value) > kind.limit:
            raise InvalidReport("bad_text", f"{path} is longer than {kind.limit} characters", path)
        if kind.required and not value:
            raise InvalidReport("bad_text", f"{path} must not be empty", path)
        if MARKUP.search(value):
            self.markup_seen = True
        return value

    def value(self, kind, value, path: str):
        if isinstance(kind, Number):
            return self.number(kind, value, path)
        if isinstance(kind, Text):
            return self.text(kind, value, path)
        if isinstance(kind, Choice):
            if not isinstance(value, str) or value not in kind.choices:
                raise InvalidReport("bad_field", f"{path} must be one of {', '.join(kind.choices)}", path)
            return value
        if isinstance(kind, Flag):
            if not isinstance(value, bool):
                raise InvalidReport("bad_field", f"{path} must be true or false", path)
            return value
        if isinstance(kind, TextList):
            if not isinstance(value, list):
                raise InvalidReport("bad_field", f"{path} must be a list", path)
            if not kind.min_items <= len(value) <= kind.max_items:
                raise InvalidReport("bad_field", f"{path} must hold {kind.min_items} to {kind.max_items} names", path)
            return [self.text(Text(kind.limit), item, f"{path}[{i}]") for i, item in enumerate(value)]
        if isinstance(kind, Ranks):
            return self.ranks(kind, value, path)
        if isinstance(kind, ObjectList):
            if not isinstance(value, list):
                raise InvalidReport("bad_field", f"{path} must be a list", path)
            if not kind.min_items <= len(value) <= kind.max_items:
                raise InvalidReport("bad_field", f"{path} must hold {kind.min_items} to {kind.max_items} items", path)
            return [self.object(kind.fields, item, f"{path}[{i}]") for i, item in enumerate(value)]
        if isinstance(kind, Object):
            return self.object(kind.fields, value, path)
        raise AssertionError(f"unknown field kind {kind!r}")

    def object(self, fields: dict, value, path: str) -> dict:
        if not isinstance(value, dict):
            raise InvalidReport("bad_field", f"{path or 'the report'} must be a JSON object", path)
        self.dropped += sum(1 for key in value if key not in fields)
        cleaned = {}
        for key, kind in fields.items():
            where = f"{path}.{key}" if path else key
            if value.get(key) is None:
                if kind.required:
                    raise InvalidReport("missing_field", f"{where} is missing", where)
                continue
            cleaned[key] = self.value(kind, value[key], where)
        return cleaned

    def ranks(self, kind: Ranks, value, path: str) -> list:
        if not isinstance(value, list):
            raise InvalidReport("bad_ranks", f"{path} must be a list of the two ranks", path)
        if len(value) != 2:
            raise InvalidReport("bad_ranks", f"{path} must list exactly 2 ranks, not {len(value)}", path)
        rows = [self.object(kind.fields, row, f"{path}[{i}]") for i, row in enumerate(value)]
        if sorted(row["rank"] for row in rows) != [0, 1]:
            raise InvalidReport("bad_ranks", f"{path} must list rank 0 and rank 1, once each", path)
        return sorted(rows, key=lambda row: row["rank"])
