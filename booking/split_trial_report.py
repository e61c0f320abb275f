"""Validate a split-trial report (nodekit/split_trial.py, schemas ``binome.split-trial/2`` and
the DDP-only ``/1``) uploaded to the portal, and the conclusion the portal writes from it.

The validator is pure (standard library only, no torch, no database): its one entry point is below. The upload
service at the end (`split_trial_upload`) keeps a valid report with its order and turns the validator's codes into
the customer's language::

    from booking.split_trial_report import InvalidReport, parse_report

    try:
        report = parse_report(uploaded_bytes)          # max_bytes=256_000 by default
    except InvalidReport as exc:
        show(exc.code, exc.path)                       # translate by code; exc.args[0] is an English message

``parse_report`` returns a new dict holding only the keys listed in ``REPORT`` below, with their types checked:
numbers finite and within sane bounds (no NaN, no Infinity, no 1e400, no 40-digit integers, no booleans for
numbers), text stripped of control characters (C0/C1, bidi overrides, lone surrogates) and length-limited,
``pair.ranks`` exactly two entries for ranks 0 and 1. Unknown keys are dropped, never an error. Text is kept as
text, markup included: the cleaned report carries ``"validation": {"text_format": "plain", "markup_seen": ...,
"dropped_keys": N}`` and the portal must escape every string on output (Django templates do).

A report with an ``error`` (a phase failed) may have ``single``, ``pair`` and ``comparison`` null or missing;
without one, all three are required.

Codes of ``InvalidReport.code``:

- ``too_large``: more than ``max_bytes`` bytes;
- ``not_json``: not UTF-8 text, not JSON, a duplicated key;
- ``too_deep``: JSON nested deeper than ``MAX_DEPTH`` levels;
- ``wrong_schema``: not an object, or ``schema`` is neither ``binome.split-trial/2`` nor ``/1``;
- ``missing_field``: a required field is absent or null;
- ``bad_field``: a field has the wrong type (object, list, true/false) or a value outside its fixed choices;
- ``bad_number``: NaN, Infinity, a number too large, negative, out of bounds or not an integer where one is due;
- ``bad_text``: not a string, empty where text is required, or longer than its limit;
- ``bad_ranks``: ``pair.ranks`` does not list exactly ranks 0 and 1, or the phases contradict each other
  (different global batch or number of examples).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import TYPE_CHECKING

from django.utils.translation import gettext, gettext_lazy

if TYPE_CHECKING:
    from booking.models import Order

SCHEMA = "binome.split-trial/2"
SCHEMA_V1 = "binome.split-trial/1"  # reports of the DDP-only kit, still accepted and shown as they were
SCHEMAS = (SCHEMA_V1, SCHEMA)
MAX_BYTES = 256_000
MAX_DEPTH = 32
MAX_INT_DIGITS = 16

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


def _int(high: float, **kw) -> Number:
    return Number(0, high, integer=True, **kw)


MS = 1e7  # 10 000 s per step: beyond that it is not a step time
MIB = 1e9  # about 1 EiB: beyond any card or host
_PHASE = {
    "device": Text(40, required=False),
    "device_name": Text(200, required=False),
    "step_time_ms_median": Number(0, MS),
    "step_time_ms_p90": Number(0, MS),
    "peak_memory_mib": Number(0, MIB),
    "peak_rss_mib": Number(0, MIB, required=False),
    "memory_total_mib": Number(0, MIB, required=False),
    "peak_memory_percent": Number(0, 100, required=False),
    "steps_measured": _int(1e7),
    "warmup_steps": _int(1e7),
    "global_batch": _int(1e8, required=False),
    "per_rank_batch": _int(1e8, required=False),
    "examples": _int(1e10, required=False),
    "examples_processed": _int(1e13, required=False),
    "loss_finite": Flag(required=False),
    "cpu_threads": _int(1e5, required=False),
    "wall_s": Number(0, 1e7, required=False),
}
_RANK = {
    "rank": _int(1),
    **{key: kind for key, kind in _PHASE.items() if key not in ("steps_measured", "warmup_steps")},
    "step_time_ms_p90": Number(0, MS, required=False),
    "steps_measured": _int(1e7, required=False),
    "warmup_steps": _int(1e7, required=False),
    "comm_time_ms_median": Number(0, MS),
    "comm_exposed_ms_median": Number(0, MS, required=False),
    "comm_fraction": Number(0, 1),
}

REPORT = {
    "started_at": Text(40, required=False),
    "duration_s": Number(0, 1e7, required=False),
    "environment": Object(
        {
            "torch": Text(80),
            "python": Text(40, required=False),
            "device_kind": Choice("cpu", "cuda", "rocm"),
            "backend": Choice("gloo", "nccl", "rccl"),
            "torch_backend": Choice("gloo", "nccl", required=False),
            "device_names": TextList(200, 0, 2),
            "precision": Choice("fp32", "bf16"),
            "precision_detail": Text(300, required=False),
            "examples": _int(1e10),
            "global_batch": _int(1e8),
            "per_rank_batch": _int(1e8, required=False),
            "steps": _int(1e7),
            "warmup_steps": _int(1e7),
            "steps_measured": _int(1e7, required=False),
            "examples_processed": _int(1e13, required=False),
            "model": Text(300, required=False),
            "optimizer": Text(100, required=False),
            "seed": _int(2**63, required=False),
            "parameters": _int(1e14, required=False),
            "peak_memory_source": Text(300, required=False),
            "comm_timing": Text(600, required=False),
            "same_data": Text(300, required=False),
            "cpu_threads_single": _int(1e5, required=False),
            "cpu_threads_per_rank": _int(1e5, required=False),
        }
    ),
    "single": Object({**_PHASE, "rank": _int(0, required=False)}),
    "pair": Object(
        {
            "ranks": Ranks(_RANK),
            "step_time_ms_median": Number(0, MS),
            "step_time_ms_p90": Number(0, MS, required=False),
            "slowest_rank": _int(1, required=False),
            "comm_time_ms_median": Number(0, MS, required=False),
            "steps_measured": _int(1e7, required=False),
            "warmup_steps": _int(1e7, required=False),
            "global_batch": _int(1e8, required=False),
            "per_rank_batch": _int(1e8, required=False),
            "examples": _int(1e10, required=False),
            "examples_processed": _int(1e13, required=False),
            "imbalance": Object({"flag": Flag(), "max_over_min": Number(1, 1e6), "detail": Text(600, required=False)}),
            "wall_s": Number(0, 1e7, required=False),
        }
    ),
    "comparison": Object(
        {
            "speedup": Number(0, 1e4),
            "step_change_percent": Number(0, 1e6),
            "step_change": Choice("shorter", "longer", "unchanged", required=False),
            "comm_cost_percent": Number(0, 100),
            "comm_exposed_percent": Number(0, 100, required=False),
            "same_global_batch": Flag(required=False),
            "same_examples": Flag(required=False),
        }
    ),
    "conclusion": Text(1000),
    "error": Text(2000, required=False),
}
_PHASES = ("single", "pair", "comparison")

STRATEGIES = ("single", "ddp", "fsdp", "pipeline", "ddp_bigger_batch")
TWO_CARD_CONSTANT_BATCH = ("ddp", "fsdp", "pipeline")
STATUSES = ("ok", "out_of_memory", "failed", "not_applicable")
RUN_CODES = (
    "model_state_over_card_memory",
    "device_out_of_memory",
    "pipeline_needs_sequential",
    "needs_two_cards",
    "rank_failed",
    "timed_out",
)
_CARD = {
    "rank": _int(1),
    "device_name": Text(200, required=False),
    "step_time_ms_median": Number(0, MS, required=False),
    "peak_memory_mib": Number(0, MIB, required=False),
    "memory_total_mib": Number(0, MIB, required=False),
    "model_state_mib": Number(0, MIB, required=False),
}
_RUN = {
    "strategy": Choice(*STRATEGIES),
    "cards": Number(1, 2, integer=True),
    "status": Choice(*STATUSES),
    "code": Choice(*RUN_CODES, required=False),
    "error": Text(2000, required=False),
    "global_batch": _int(1e8),
    "per_card_batch": _int(1e8),
    "examples_processed": _int(1e13, required=False),
    "steps_measured": _int(1e7, required=False),
    "step_time_ms_median": Number(0, MS, required=False),
    "step_time_ms_p90": Number(0, MS, required=False),
    "examples_per_s": Number(0, 1e12, required=False),
    "comm_time_ms_median": Number(0, MS, required=False),
    "loss_finite": Flag(required=False),
    "imbalance": Object({"flag": Flag(), "max_over_min": Number(1, 1e6)}, required=False),
    "per_card": ObjectList(_CARD, 0, 2, required=False),
}
REPORT_V2 = {
    "started_at": Text(40, required=False),
    "duration_s": Number(0, 1e7, required=False),
    "environment": Object(
        {
            "torch": Text(80),
            "python": Text(40, required=False),
            "device_kind": Choice("cpu", "cuda", "rocm"),
            "backend": Choice("gloo", "nccl", "rccl"),
            "device_names": TextList(200, 0, 2),
            "precision": Choice("fp32", "bf16"),
            "examples": _int(1e10),
            "global_batch": _int(1e8),
            "steps": _int(1e7),
            "warmup_steps": _int(1e7),
            "steps_measured": _int(1e7, required=False),
            "model": Choice("default_mlp", "plugin", required=False),
            "default_model": Object({"hidden": _int(1e6), "layers": _int(1e4)}, required=False),
            "seed": _int(2**63, required=False),
            "parameters": _int(1e14, required=False),
            "peak_memory_source": Choice("rss", "max_memory_allocated", required=False),
            "card_memory_mib": Number(0, MIB, required=False),
        }
    ),
    "runs": ObjectList(_RUN, 0, len(STRATEGIES)),
    "findings": Object({"fits_one_card": Flag(), "possible_only_on_two_cards": Flag()}, required=False),
    "error": Text(2000, required=False),
}
# What a run that completed must carry (the rest is optional everywhere).
_RUN_OK = ("steps_measured", "step_time_ms_median", "examples_per_s", "per_card")

# C0 and C1 controls, DEL, bidi embeddings/overrides/isolates, zero-width and BOM, lone surrogates.
_STRIP = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb\ud800-\udfff]"
)
_SPACES = re.compile(r"[\t\n\r]+")
# Possessive `\s*+`: a `<` and a long run of spaces with no letter after it is one pass, not quadratic.
_MARKUP = re.compile(r"<\s*+/?\s*+[A-Za-z!?]|&#?\w+;|javascript:", re.IGNORECASE)
_SPECIAL = re.compile(r'[\[\]{}"\\]')


# --------------------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------------------


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


def _load(raw, max_bytes: int):
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


# --------------------------------------------------------------------------------------------------------------
# Cleaning
# --------------------------------------------------------------------------------------------------------------


class _Cleaner:
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
        value = _SPACES.sub(" ", value)
        value = _STRIP.sub("", value)
        value = unicodedata.normalize("NFC", value).strip()
        if len(value) > kind.limit:
            raise InvalidReport("bad_text", f"{path} is longer than {kind.limit} characters", path)
        if kind.required and not value:
            raise InvalidReport("bad_text", f"{path} must not be empty", path)
        if _MARKUP.search(value):
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


def _check_consistency(report: dict) -> None:
    environment = report["environment"]
    if environment["warmup_steps"] >= environment["steps"]:
        raise InvalidReport(
            "bad_number", "environment.warmup_steps must be smaller than environment.steps", "environment"
        )
    for phase in ("single", "pair"):
        section = report.get(phase)
        if not section:
            continue
        for key in ("global_batch", "examples"):
            if key in section and section[key] != environment[key]:
                raise InvalidReport(
                    "bad_ranks", f"{phase}.{key} differs from environment.{key}: the phases must match", phase
                )
        rows = [section, *section.get("ranks", [])]
        if any(row.get("steps_measured", 0) + environment["warmup_steps"] > environment["steps"] for row in rows):
            raise InvalidReport("bad_number", f"{phase}: more steps measured than environment.steps allows", phase)


def _check_runs(report: dict) -> None:
    """The runs of a version-2 report agree with each other and with the environment."""
    environment, runs = report["environment"], report["runs"]
    if environment["warmup_steps"] >= environment["steps"]:
        raise InvalidReport(
            "bad_number", "environment.warmup_steps must be smaller than environment.steps", "environment"
        )
    seen = set()
    for index, run in enumerate(runs):
        path, strategy = f"runs[{index}]", run["strategy"]
        if strategy in seen:
            raise InvalidReport("bad_ranks", f"{path}: the run {strategy} appears twice", path)
        seen.add(strategy)
        if run["cards"] != (1 if strategy == "single" else 2):
            raise InvalidReport("bad_ranks", f"{path}: {strategy} does not run on {run['cards']} card(s)", path)
        expected = environment["global_batch"] * (2 if strategy == "ddp_bigger_batch" else 1)
        if run["global_batch"] != expected:
            raise InvalidReport(
                "bad_ranks", f"{path}.global_batch must be {expected}: the runs must share the data", path
            )
        if run["status"] != "ok":
            continue
        missing = [key for key in _RUN_OK if key not in run]
        if missing:
            raise InvalidReport("missing_field", f"{path}.{missing[0]} is missing", f"{path}.{missing[0]}")
        if sorted(card["rank"] for card in run["per_card"]) != list(range(run["cards"])):
            raise InvalidReport("bad_ranks", f"{path}.per_card must list each card of the run once", path)
        if run["steps_measured"] + environment["warmup_steps"] > environment["steps"]:
            raise InvalidReport("bad_number", f"{path}: more steps measured than environment.steps allows", path)
        run["per_card"] = sorted(run["per_card"], key=lambda card: card["rank"])
    if not report.get("error") and "single" not in seen:
        raise InvalidReport("missing_field", "runs: the one-card run is missing", "runs")
    if "findings" in report:  # the kit's own codes must say what its runs say: the portal words them
        derived = split_trial_findings(report)
        for key in ("fits_one_card", "possible_only_on_two_cards"):
            if report["findings"][key] != derived[key]:
                raise InvalidReport("bad_field", f"findings.{key} contradicts the runs", f"findings.{key}")


def _parse_v2(data: dict) -> dict:
    cleaner = _Cleaner()
    cleaned = {"schema": SCHEMA, **cleaner.object(REPORT_V2, {k: v for k, v in data.items() if k != "schema"}, "")}
    _check_runs(cleaned)
    cleaned["validation"] = {
        "text_format": "plain",
        "markup_seen": cleaner.markup_seen,
        "dropped_keys": cleaner.dropped,
    }
    return cleaned


def parse_report(raw: bytes, *, max_bytes: int = MAX_BYTES) -> dict:
    """A cleaned copy of an uploaded split-trial report; raises InvalidReport (a ValueError) with a code."""
    data = _load(raw, max_bytes)
    if not isinstance(data, dict):
        raise InvalidReport("wrong_schema", "the report must be a JSON object")
    if data.get("schema") not in SCHEMAS:
        raise InvalidReport(
            "wrong_schema", f"this is not a split-trial report (schema must be {' or '.join(SCHEMAS)})", "schema"
        )
    if data["schema"] == SCHEMA:
        return _parse_v2(data)
    error = data.get("error")
    failed = isinstance(error, str) and _STRIP.sub("", _SPACES.sub(" ", error[:4000])).strip() != ""
    fields = {
        key: (Object(kind.fields, required=False) if failed and key in _PHASES else kind)
        for key, kind in REPORT.items()
    }
    cleaner = _Cleaner()
    cleaned = {"schema": SCHEMA_V1, **cleaner.object(fields, {k: v for k, v in data.items() if k != "schema"}, "")}
    _check_consistency(cleaned)
    cleaned["validation"] = {
        "text_format": "plain",
        "markup_seen": cleaner.markup_seen,
        "dropped_keys": cleaner.dropped,
    }
    return cleaned


# --- the upload: a report kept with its order, or the reason it is refused in the customer's language ---


def split_trial_upload(*, order: Order, raw: bytes):
    """Keep a split-trial kit report with the order, once it has been validated field by field."""
    from booking.models import SplitTrialReport
    from booking.rules import BookingError

    try:
        report = parse_report(raw)
    except InvalidReport as exc:
        raise BookingError(
            SPLIT_TRIAL_MESSAGES.get(exc.code, SPLIT_TRIAL_MESSAGES["not_json"]), field="report"
        ) from exc
    if order.split_trials.count() >= 20:
        raise BookingError(gettext("This order already keeps 20 reports."), field="report")
    return SplitTrialReport.objects.create(order=order, report=report)


def _split_trial_messages() -> dict:

    return {
        "too_large": gettext_lazy("This report is too large: a split-trial report is a few kilobytes of JSON."),
        "not_json": gettext_lazy("This file is not a JSON report written by the split-trial kit."),
        "too_deep": gettext_lazy("This JSON is nested too deeply to be a split-trial report."),
        "wrong_schema": gettext_lazy("This is not a report of the split-trial kit (its schema is unknown)."),
        "missing_field": gettext_lazy("This report misses a field the split-trial kit always writes."),
        "bad_field": gettext_lazy("A field of this report has the wrong type."),
        "bad_number": gettext_lazy("A number of this report is not a finite, plausible measurement."),
        "bad_text": gettext_lazy("A text of this report is empty or too long."),
        "bad_ranks": gettext_lazy("The two-card phase must report exactly ranks 0 and 1, consistent with the run."),
    }


SPLIT_TRIAL_MESSAGES = _split_trial_messages()


# --- the conclusion: written by the portal in the page's language, beside the hypothesis written at booking ---
#
# A version-2 report carries codes and figures only (nodekit/split_trial.py); everything a researcher reads is
# written here, with gettext, in the language of the request. `split_trial_conclusion` is pure: it takes a report
# already cleaned by parse_report and the order's hypothesis and sharing choice.

SUPPORTED_RATIO = 1.05  # below a 5 % gain, timing noise and the exchanges' cost make "supported" an overstatement

STRATEGY_LABELS = {
    "single": gettext_lazy("one card"),
    "ddp": gettext_lazy("data parallel (DDP)"),
    "fsdp": gettext_lazy("parameters sharded (FSDP)"),
    "pipeline": gettext_lazy("layers split (pipeline)"),
    "ddp_bigger_batch": gettext_lazy("data parallel at twice the global batch"),
}
STATUS_LABELS = {
    "ok": gettext_lazy("measured"),
    "out_of_memory": gettext_lazy("out of memory"),
    "failed": gettext_lazy("failed"),
    "not_applicable": gettext_lazy("not applicable (the model is not a sequence of layers)"),
}
# The run each sharing choice of the booking form is measured by.
SHARING_RUNS = {"full_copy": "ddp", "parameters_sharded": "fsdp", "layers_split": "pipeline"}


def _figure(value: float, digits: int = 1) -> str:
    from django.utils.formats import number_format

    return number_format(round(value, digits), digits)


def split_trial_findings(report: dict) -> dict:
    """Codes and figures derived from a cleaned version-2 report: what the conclusion is built from."""
    runs = {run["strategy"]: run for run in report.get("runs", [])}
    single = runs.get("single")
    ok = {name: run for name, run in runs.items() if run["status"] == "ok"}
    two_card = [ok[name] for name in TWO_CARD_CONSTANT_BATCH if name in ok and ok[name]["step_time_ms_median"] > 0]
    best = min(two_card, key=lambda run: run["step_time_ms_median"]) if two_card else None
    single_ok = single is not None and single["status"] == "ok" and single["step_time_ms_median"] > 0
    single_oom = single is not None and single["status"] == "out_of_memory"
    bigger = ok.get("ddp_bigger_batch")
    return {
        "fits_one_card": single_ok,
        "possible_only_on_two_cards": single_oom and bool(ok.keys() - {"single"}),
        "best": best["strategy"] if best else None,
        "speedup": single["step_time_ms_median"] / best["step_time_ms_median"] if single_ok and best else None,
        "throughput_ratio": bigger["examples_per_s"] / single["examples_per_s"]
        if single_ok and bigger and single["examples_per_s"] > 0
        else None,
        "two_card_ok": [name for name in ok if name != "single"],
        "unbalanced": [
            (name, run["imbalance"]["max_over_min"]) for name, run in ok.items() if run.get("imbalance", {}).get("flag")
        ],
    }


def _verdict(hypothesis: str, report: dict, found: dict) -> tuple[str, str]:
    """(verdict code, sentence) for the order's hypothesis."""
    best = STRATEGY_LABELS[found["best"]] if found["best"] else ""
    if hypothesis == "shorter_step":
        if found["speedup"] is not None:
            values = {"ratio": _figure(found["speedup"]), "strategy": best}
            if found["speedup"] >= SUPPORTED_RATIO:
                return "supported", gettext(
                    "Shorter step: supported, %(ratio)s× at constant global batch (%(strategy)s)."
                ) % values
            return "not_supported", gettext(
                "Shorter step: not supported, %(ratio)s× at constant global batch with the best way of sharing "
                "(%(strategy)s)."
            ) % values
        if not found["fits_one_card"] and found["two_card_ok"]:
            return "not_measurable", gettext(
                "Shorter step: cannot be compared, the model does not fit one card (possible only on two cards)."
            )
        return "not_measurable", gettext("Shorter step: not measured, no run at constant global batch completed.")
    if hypothesis == "bigger_batch":
        bigger = next((run for run in report.get("runs", []) if run["strategy"] == "ddp_bigger_batch"), None)
        batch = bigger["global_batch"] if bigger else report["environment"]["global_batch"] * 2
        if found["throughput_ratio"] is not None:
            values = {"ratio": _figure(found["throughput_ratio"]), "batch": batch}
            if found["throughput_ratio"] >= SUPPORTED_RATIO:
                return "supported", gettext(
                    "Bigger global batch: supported, %(ratio)s× the examples per second of one card at a global "
                    "batch of %(batch)s."
                ) % values
            return "not_supported", gettext(
                "Bigger global batch: not supported, %(ratio)s× the examples per second of one card at a global "
                "batch of %(batch)s."
            ) % values
        return "not_measurable", gettext(
            "Bigger global batch: not measured, the one-card run or the run at twice the global batch did not complete."
        )
    if hypothesis == "make_possible":
        if found["possible_only_on_two_cards"]:
            names = ", ".join(str(STRATEGY_LABELS[name]) for name in found["two_card_ok"])
            return "supported", gettext("Make the run possible: supported, possible only on two cards (%(ways)s).") % {
                "ways": names
            }
        if found["fits_one_card"]:
            return "not_supported", gettext("Make the run possible: not supported, the model fits one card.")
        return "not_supported", gettext("Make the run possible: not supported, no way of sharing ran on two cards.")
    if hypothesis == "compare_hyperparameters":
        return "not_tested", gettext(
            "Compare hyperparameters: the kit does not test this; two independent runs, one per card, usually "
            "answer it better than one distributed run."
        )
    return "not_tested", gettext(
        "The kit does not test this hypothesis: read the figures against the measure you wrote at booking."
    )


def split_trial_conclusion(*, report: dict, hypothesis: str, sharing: str = "") -> dict:
    """The conclusion of a cleaned report, in the active language: {"verdict", "sentence", "notes"}.

    A version-1 report (the DDP-only kit) keeps the English sentence it carried."""
    if report.get("schema") != SCHEMA:
        return {"verdict": "legacy", "sentence": report.get("conclusion", ""), "notes": []}
    found = split_trial_findings(report)
    verdict, sentence = _verdict(hypothesis, report, found)
    notes = []
    if found["possible_only_on_two_cards"] and hypothesis != "make_possible":
        notes.append(gettext("The model does not fit one card: possible only on two cards."))
    runs = {run["strategy"]: run for run in report.get("runs", [])}
    chosen = runs.get(SHARING_RUNS.get(sharing, ""))
    if chosen is not None:
        values = {"strategy": STRATEGY_LABELS[chosen["strategy"]], "status": STATUS_LABELS[chosen["status"]]}
        if chosen["status"] == "ok":
            values.update(step=_figure(chosen["step_time_ms_median"]), rate=_figure(chosen["examples_per_s"], 0))
            notes.append(
                gettext(
                    "The way of sharing chosen at booking, %(strategy)s: %(step)s ms per step, %(rate)s examples "
                    "per second."
                )
                % values
            )
        else:
            notes.append(gettext("The way of sharing chosen at booking, %(strategy)s: %(status)s.") % values)
    for name, ratio in found["unbalanced"]:
        notes.append(
            gettext(
                "Unbalanced split with %(strategy)s: one card's peak memory is %(ratio)s× the other's (one nearly "
                "empty, the other saturated)."
            )
            % {"strategy": STRATEGY_LABELS[name], "ratio": _figure(ratio)}
        )
    environment = report["environment"]
    notes.append(
        gettext(
            "Held constant: %(precision)s, %(examples)s examples, global batch %(batch)s (twice that for the bigger "
            "batch run); the first %(warmup)s of %(steps)s steps discarded as warm-up."
        )
        % {
            "precision": environment["precision"],
            "examples": environment["examples"],
            "batch": environment["global_batch"],
            "warmup": environment["warmup_steps"],
            "steps": environment["steps"],
        }
    )
    if environment["device_kind"] == "cpu":
        notes.append(gettext("Measured on the CPU (two gloo processes sharing its cores): a check, not a GPU measure."))
    return {"verdict": verdict, "sentence": sentence, "notes": notes}
