"""Validate a split-trial report (nodekit/split_trial.py, schemas ``binome.split-trial/2`` and
the DDP-only ``/1``) uploaded to the portal.

The validator is pure (standard library only, no torch, no database): its one entry point is below. It declares
the report with the schema framework of booking/report_schema.py and loads the upload with booking/hostile_json.py.
The upload service (booking/split_trial_upload.py) keeps a valid report with its order and turns the validator's
codes into the customer's language; booking/split_trial_conclusion.py writes the conclusion from a cleaned report::

    from booking.report_schema import InvalidReport
    from booking.split_trial_report import parse_report

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
- ``too_deep``: JSON nested deeper than ``hostile_json.MAX_DEPTH`` levels;
- ``wrong_schema``: not an object, or ``schema`` is neither ``binome.split-trial/2`` nor ``/1``;
- ``missing_field``: a required field is absent or null;
- ``bad_field``: a field has the wrong type (object, list, true/false) or a value outside its fixed choices;
- ``bad_number``: NaN, Infinity, a number too large, negative, out of bounds or not an integer where one is due;
- ``bad_text``: not a string, empty where text is required, or longer than its limit;
- ``bad_ranks``: ``pair.ranks`` does not list exactly ranks 0 and 1, or the phases contradict each other
  (different global batch or number of examples).
"""

from booking.hostile_json import load_json
from booking.report_schema import (
    SPACES,
    STRIP,
    Choice,
    Cleaner,
    Flag,
    InvalidReport,
    Number,
    Object,
    ObjectList,
    Ranks,
    Text,
    TextList,
)

SCHEMA = "binome.split-trial/2"
SCHEMA_V1 = "binome.split-trial/1"  # reports of the DDP-only kit, still accepted and shown as they were
SCHEMAS = (SCHEMA_V1, SCHEMA)
MAX_BYTES = 256_000


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
    cleaner = Cleaner()
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
    data = load_json(raw, max_bytes)
    if not isinstance(data, dict):
        raise InvalidReport("wrong_schema", "the report must be a JSON object")
    if data.get("schema") not in SCHEMAS:
        raise InvalidReport(
            "wrong_schema", f"this is not a split-trial report (schema must be {' or '.join(SCHEMAS)})", "schema"
        )
    if data["schema"] == SCHEMA:
        return _parse_v2(data)
    error = data.get("error")
    failed = isinstance(error, str) and STRIP.sub("", SPACES.sub(" ", error[:4000])).strip() != ""
    fields = {
        key: (Object(kind.fields, required=False) if failed and key in _PHASES else kind)
        for key, kind in REPORT.items()
    }
    cleaner = Cleaner()
    cleaned = {"schema": SCHEMA_V1, **cleaner.object(fields, {k: v for k, v in data.items() if k != "schema"}, "")}
    _check_consistency(cleaned)
    cleaned["validation"] = {
        "text_format": "plain",
        "markup_seen": cleaner.markup_seen,
        "dropped_keys": cleaner.dropped,
    }
    return cleaned


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
