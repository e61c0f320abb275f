"""booking/split_trial_report.py: the portal's validator of uploaded split-trial reports, pure, on hand-made hostile
inputs (tests/nodekit/test_split_trial.py checks that a real run of the kit passes it)."""

import copy
import json
import time

import pytest

from booking.split_trial_report import CODES, SCHEMA, InvalidReport, parse_report


def _rank(rank: int) -> dict:
    return {
        "rank": rank,
        "device": f"cuda:{rank}",
        "device_name": "NVIDIA H200",
        "step_time_ms_median": 7.3,
        "step_time_ms_p90": 7.9,
        "comm_time_ms_median": 0.9,
        "comm_exposed_ms_median": 0.2,
        "comm_fraction": 0.12,
        "peak_memory_mib": 1200.5,
        "memory_total_mib": 143771.0,
        "peak_memory_percent": 0.8,
        "steps_measured": 25,
        "warmup_steps": 5,
    }


VALID = {
    "schema": SCHEMA,
    "started_at": "2025-01-01T00:00:00.000Z",
    "duration_s": 41.2,
    "environment": {
        "torch": "2.13.0+cu130",
        "device_kind": "cuda",
        "backend": "nccl",
        "device_names": ["NVIDIA H200", "NVIDIA H200"],
        "precision": "bf16",
        "examples": 512,
        "global_batch": 32,
        "steps": 30,
        "warmup_steps": 5,
    },
    "single": {
        "step_time_ms_median": 12.4,
        "step_time_ms_p90": 12.9,
        "peak_memory_mib": 2100.0,
        "steps_measured": 25,
        "warmup_steps": 5,
        "global_batch": 32,
        "examples": 512,
    },
    "pair": {
        "ranks": [_rank(0), _rank(1)],
        "step_time_ms_median": 7.3,
        "imbalance": {"flag": False, "max_over_min": 1.0, "detail": "balanced"},
    },
    "comparison": {"speedup": 1.7, "step_change_percent": 41.1, "step_change": "shorter", "comm_cost_percent": 12.0},
    "conclusion": "two cards cut the step by 41 % at 12 % communication cost; memory balanced.",
}


def _raw(report) -> bytes:
    return json.dumps(report).encode()


def _refused(raw: bytes, **kw) -> InvalidReport:
    with pytest.raises(InvalidReport) as caught:
        parse_report(raw, **kw)
    assert caught.value.code in CODES
    assert isinstance(caught.value, ValueError)
    assert str(caught.value)  # a clear English message for logs; the portal translates by code
    return caught.value


def _mutated(change) -> bytes:
    report = copy.deepcopy(VALID)
    change(report)
    return _raw(report)


def test_a_valid_report_round_trips():
    cleaned = parse_report(_raw(VALID))
    assert cleaned.pop("validation") == {"text_format": "plain", "markup_seen": False, "dropped_keys": 0}
    assert cleaned == VALID
    assert parse_report(_raw(VALID).decode()) == parse_report(_raw(VALID))  # str is accepted too


def test_a_failed_run_may_leave_phases_empty():
    def failed(report):
        report.update(single=None, pair=None, comparison=None, error="two-card phase: needs two cards, torch sees 1")

    cleaned = parse_report(_mutated(failed))
    assert cleaned["error"].startswith("two-card phase")
    assert "pair" not in cleaned
    assert _refused(_mutated(lambda r: r.update(pair=None))).code == "missing_field"


def test_not_json_is_refused():
    assert _refused(b"{this is not json").code == "not_json"
    assert _refused(b"\xff\xfe\x00garbage").code == "not_json"
    assert _refused(b'{"schema": "binome.split-trial/1", "schema": "other"}').code == "not_json"  # duplicate key


def test_one_megabyte_is_refused_before_parsing():
    error = _refused(b" " * 1_000_000 + _raw(VALID))
    assert error.code == "too_large"
    assert _refused(_raw(VALID), max_bytes=100).code == "too_large"


@pytest.mark.parametrize(
    "raw",
    [
        _raw(VALID).replace(b'"step_time_ms_median": 12.4', b'"step_time_ms_median": NaN'),
        _raw(VALID).replace(b'"step_time_ms_median": 12.4', b'"step_time_ms_median": Infinity'),
        _raw(VALID).replace(b'"step_time_ms_median": 12.4', b'"step_time_ms_median": -Infinity'),
        _raw(VALID).replace(b'"step_time_ms_median": 12.4', b'"step_time_ms_median": 1e400'),
        _raw(VALID).replace(b'"examples": 512', b'"examples": ' + b"9" * 5000, 1),
        _raw(VALID).replace(b'"duration_s": 41.2', b'"duration_s": 1e300'),
        _raw(VALID).replace(b'"flag": false', b'"flag": false, "ignored": NaN'),  # even where it would be dropped
    ],
    ids=["nan", "infinity", "minus-infinity", "1e400", "5000-digits", "1e300", "nan-in-dropped-key"],
)
def test_non_finite_and_huge_numbers_are_refused(raw):
    assert _refused(raw).code == "bad_number"


def test_deep_nesting_is_refused_without_recursing():
    assert _refused(b"[" * 10_000 + b"]" * 10_000).code == "too_deep"
    assert _refused(b'{"a":' * 10_000 + b"1" + b"}" * 10_000).code == "too_deep"
    brackets_in_text = copy.deepcopy(VALID)
    brackets_in_text["conclusion"] = "[[[{{{" * 100 + '\\"' + "]]]"  # text is not nesting
    assert parse_report(_raw(brackets_in_text))["conclusion"].startswith("[[[{{{")


def test_hostile_escaped_quotes_are_cheap():
    started = time.monotonic()
    _refused(b'"\\"' * 80_000)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    "raw",
    [
        _raw([VALID]),
        _raw("binome.split-trial/1"),
        _mutated(lambda r: r.update(schema="binome.split-trial/2")),
        _mutated(lambda r: r.pop("schema")),
        _mutated(lambda r: r.update(schema="binome.preflight/1")),
    ],
    ids=["list", "string", "version-2", "no-schema", "preflight"],
)
def test_wrong_schema_is_refused(raw):
    assert _refused(raw).code == "wrong_schema"


@pytest.mark.parametrize(
    "ranks",
    [[_rank(0)], [_rank(0), _rank(1), _rank(1)], [], [_rank(0), _rank(0)], "two", None],
    ids=["one", "three", "none", "rank-twice", "not-a-list", "null"],
)
def test_the_pair_needs_exactly_ranks_0_and_1(ranks):
    error = _refused(_mutated(lambda r: r["pair"].update(ranks=ranks)))
    assert error.code == ("missing_field" if ranks is None else "bad_ranks")
    assert error.path == "pair.ranks"


def test_ranks_are_returned_in_order():
    cleaned = parse_report(_mutated(lambda r: r["pair"]["ranks"].reverse()))
    assert [rank["rank"] for rank in cleaned["pair"]["ranks"]] == [0, 1]


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda r: r["single"].update(step_time_ms_median=-1.0), "single.step_time_ms_median"),
        (lambda r: r["pair"]["ranks"][1].update(comm_time_ms_median=-0.5), "pair.ranks[1].comm_time_ms_median"),
        (lambda r: r.update(duration_s=-3), "duration_s"),
        (lambda r: r["pair"]["ranks"][0].update(comm_fraction=1.5), "pair.ranks[0].comm_fraction"),
        (lambda r: r["comparison"].update(comm_cost_percent=250), "comparison.comm_cost_percent"),
        (lambda r: r["single"].update(peak_memory_mib=True), "single.peak_memory_mib"),
        (lambda r: r["single"].update(peak_memory_mib="2100"), "single.peak_memory_mib"),
        (lambda r: r["environment"].update(examples=512.5), "environment.examples"),
        (lambda r: r["environment"].update(warmup_steps=30), "environment"),
    ],
    ids=[
        "negative-step",
        "negative-comm",
        "negative-duration",
        "fraction",
        "percent",
        "bool",
        "string",
        "half",
        "warm",
    ],
)
def test_negative_and_out_of_bounds_numbers_are_refused(change, path):
    error = _refused(_mutated(change))
    assert error.code == "bad_number"
    assert error.path == path


def test_missing_fields_and_wrong_types_are_refused():
    error = _refused(_mutated(lambda r: r["pair"]["ranks"][0].pop("comm_time_ms_median")))
    assert (error.code, error.path) == ("missing_field", "pair.ranks[0].comm_time_ms_median")
    assert _refused(_mutated(lambda r: r.pop("conclusion"))).code == "missing_field"
    assert _refused(_mutated(lambda r: r.update(single=[1, 2]))).code == "bad_field"
    assert _refused(_mutated(lambda r: r["environment"].update(backend="mpi"))).code == "bad_field"
    assert _refused(_mutated(lambda r: r["pair"]["imbalance"].update(flag="no"))).code == "bad_field"
    assert _refused(_mutated(lambda r: r["environment"].update(device_names=["a", "b", "c"]))).code == "bad_field"


def test_phases_that_contradict_each_other_are_refused():
    assert _refused(_mutated(lambda r: r["single"].update(global_batch=64))).code == "bad_ranks"
    assert _refused(_mutated(lambda r: r["single"].update(examples=1024))).code == "bad_ranks"


def test_text_keeps_markup_as_plain_text_but_loses_control_characters():
    def hostile(report):
        report["conclusion"] = "<script>alert('x')</script>\x00 two\tcards\r\n cut\x1b[31m the \u202estep\u200b\x7f."
        report["environment"]["device_names"][0] = "<img src=x onerror=alert(1)>\x07"

    cleaned = parse_report(_mutated(hostile))
    assert cleaned["conclusion"] == "<script>alert('x')</script> two cards  cut[31m the step."
    assert cleaned["environment"]["device_names"][0] == "<img src=x onerror=alert(1)>"
    assert cleaned["validation"]["text_format"] == "plain"
    assert cleaned["validation"]["markup_seen"] is True


def test_text_limits():
    assert _refused(_mutated(lambda r: r.update(conclusion="x" * 5000))).code == "bad_text"
    assert _refused(_mutated(lambda r: r.update(conclusion="\x00\x01 \t"))).code == "bad_text"  # empty once cleaned
    assert _refused(_mutated(lambda r: r.update(conclusion=42))).code == "bad_text"
    assert _refused(_mutated(lambda r: r["environment"].update(torch="\ud800"))).code == "bad_text"


def test_extra_keys_are_dropped_not_errors():
    def extra(report):
        report["html"] = "<b>hi</b>"
        report["environment"]["secret"] = {"nested": [1, 2, 3]}
        report["pair"]["ranks"][0]["extra"] = 1
        report["comparison"]["__proto__"] = {}

    cleaned = parse_report(_mutated(extra))
    assert "html" not in cleaned
    assert "secret" not in cleaned["environment"]
    assert "extra" not in cleaned["pair"]["ranks"][0]
    assert "__proto__" not in cleaned["comparison"]
    assert cleaned["validation"]["dropped_keys"] == 4
    assert cleaned["validation"]["markup_seen"] is False  # dropped text is not looked at
