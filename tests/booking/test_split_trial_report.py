"""booking/split_trial_report.py: the portal's validator of uploaded split-trial reports, pure, on hand-made hostile
inputs (tests/nodekit/test_split_trial.py checks that a real run of the kit passes it)."""

import copy
import json

import pytest

from booking import hostile_json
from booking.report_schema import CODES, InvalidReport
from booking.split_trial_conclusion import split_trial_conclusion
from booking.split_trial_report import parse_report
from tests.builders.split_trial import VALID, _rank


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


def test_hostile_escaped_quotes_are_read_in_one_pass(monkeypatch):
    """240,000 quotes and backslashes: the depth check reads them once (each escape skipped where it stands, never
    a rescan from it), then the report is refused as not JSON."""
    scans = []
    special = hostile_json._SPECIAL

    class CountedSpecial:
        def finditer(self, text, pos=0, *args):
            scans.append(len(text) - pos)
            return special.finditer(text, pos, *args)

    monkeypatch.setattr(hostile_json, "_SPECIAL", CountedSpecial())
    raw = b'"\\"' * 80_000
    assert _refused(raw).code == "not_json"
    assert scans == [len(raw)]


@pytest.mark.parametrize(
    "raw",
    [
        _raw([VALID]),
        _raw("binome.split-trial/1"),
        _mutated(lambda r: r.update(schema="binome.split-trial/9")),
        _mutated(lambda r: r.pop("schema")),
        _mutated(lambda r: r.update(schema="binome.preflight/1")),
    ],
    ids=["list", "string", "version-9", "no-schema", "preflight"],
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


# --------------------------------------------------------------------------------------------------------------
# Version 2: every way of sharing, codes and figures only; the conclusion written by the portal
# --------------------------------------------------------------------------------------------------------------


def _card(rank: int, peak: float = 30_000.0) -> dict:
    return {"rank": rank, "device_name": "NVIDIA H200", "peak_memory_mib": peak, "model_state_mib": 20_000.0}


def _run(strategy: str, step_ms: float, *, batch: int = 32, peaks=(30_000.0, 30_500.0), **extra) -> dict:
    cards = 1 if strategy == "single" else 2
    run = {
        "strategy": strategy,
        "cards": cards,
        "status": "ok",
        "global_batch": batch,
        "per_card_batch": batch if strategy in ("single", "pipeline") else batch // 2,
        "steps_measured": 30,
        "step_time_ms_median": step_ms,
        "examples_per_s": round(batch / (step_ms / 1e3), 1),
        "per_card": [_card(rank, peaks[rank]) for rank in range(cards)],
    }
    if cards == 2:
        high, low = max(peaks), min(peaks)
        run["imbalance"] = {"flag": high / low >= 1.25 and high - low >= 256, "max_over_min": round(high / low, 3)}
    run.update(extra)
    return run


VALID_V2 = {
    "schema": "binome.split-trial/2",
    "environment": {
        "torch": "2.13.0+cu130",
        "device_kind": "cuda",
        "backend": "nccl",
        "device_names": ["NVIDIA H200", "NVIDIA H200"],
        "precision": "bf16",
        "examples": 2048,
        "global_batch": 32,
        "steps": 50,
        "warmup_steps": 20,
    },
    "runs": [
        _run("single", 17.0),
        _run("ddp", 10.0, comm_time_ms_median=1.5),
        _run("fsdp", 12.0),
        _run("pipeline", 15.0, peaks=(70_000.0, 2_000.0), comm_time_ms_median=2.0),
        _run("ddp_bigger_batch", 11.0, batch=64),
    ],
    "findings": {"fits_one_card": True, "possible_only_on_two_cards": False},
}


def _v2(change=None) -> dict:
    report = copy.deepcopy(VALID_V2)
    if change:
        change(report)
    return report


def test_a_version_2_report_round_trips():
    cleaned = parse_report(_raw(VALID_V2))
    assert cleaned.pop("validation")["dropped_keys"] == 0
    assert cleaned == VALID_V2


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda r: r["runs"][1].update(strategy="tensor_parallel"), "bad_field"),
        (lambda r: r["runs"].__setitem__(2, copy.deepcopy(r["runs"][1])), "bad_ranks"),  # a run twice
        (lambda r: r["runs"].extend([r["runs"][0]] * 5), "bad_field"),  # more runs than strategies
        (lambda r: r["runs"][1].update(cards=1), "bad_ranks"),
        (lambda r: r["runs"][2].update(global_batch=64), "bad_ranks"),  # not the same data
        (lambda r: r["runs"][4].update(global_batch=32), "bad_ranks"),  # the bigger batch is twice the global one
        (lambda r: r["runs"][1].pop("step_time_ms_median"), "missing_field"),
        (lambda r: r["runs"][1].update(per_card=[_card(0), _card(0)]), "bad_ranks"),
        (lambda r: r["runs"][1].update(status="exploded"), "bad_field"),
        (lambda r: r["runs"][1].update(code="rm -rf /"), "bad_field"),
        (lambda r: r["runs"][1].update(examples_per_s=-3), "bad_number"),
        (lambda r: r["runs"][1]["imbalance"].update(flag="yes"), "bad_field"),
        (lambda r: r["runs"][1].update(steps_measured=40), "bad_number"),  # 40 + 20 warm-up > 50 steps
        (lambda r: r.update(runs=r["runs"][1:]), "missing_field"),  # no one-card run
        (lambda r: r.update(runs={"single": 1}), "bad_field"),
        (lambda r: r.update(schema="binome.split-trial/3"), "wrong_schema"),
        (lambda r: r["findings"].update(possible_only_on_two_cards=True), "bad_field"),  # contradicts the runs
        (lambda r: r["findings"].update(fits_one_card="yes"), "bad_field"),
    ],
)
def test_hostile_version_2_reports_are_refused_with_a_code(change, code):
    assert _refused(_raw(_v2(change))).code == code


def test_a_nan_hidden_in_a_run_is_refused():
    raw = _raw(VALID_V2).replace(b'"step_time_ms_median": 10.0', b'"step_time_ms_median": NaN')
    assert _refused(raw).code == "bad_number"


def test_out_of_memory_and_not_applicable_runs_carry_no_figures():
    def no_single(report):
        report["runs"][0] = {
            "strategy": "single",
            "cards": 1,
            "status": "out_of_memory",
            "global_batch": 32,
            "per_card_batch": 32,
            "code": "model_state_over_card_memory",
        }
        report["runs"][3] = {
            "strategy": "pipeline",
            "cards": 2,
            "status": "not_applicable",
            "global_batch": 32,
            "per_card_batch": 32,
            "code": "pipeline_needs_sequential",
        }
        report["findings"] = {"fits_one_card": False, "possible_only_on_two_cards": True}

    cleaned = parse_report(_raw(_v2(no_single)))
    assert [run["status"] for run in cleaned["runs"]] == ["out_of_memory", "ok", "ok", "not_applicable", "ok"]
    assert "step_time_ms_median" not in cleaned["runs"][0]


# --- the conclusion, in the page's language, beside the hypothesis ---


def _conclude(report: dict, hypothesis: str, language: str, sharing: str = "") -> dict:
    from django.utils import translation

    with translation.override(language):
        return split_trial_conclusion(report=parse_report(_raw(report)), hypothesis=hypothesis, sharing=sharing)


def test_shorter_step_is_concluded_in_english_and_in_french_from_the_same_report():
    english = _conclude(VALID_V2, "shorter_step", "en", sharing="full_copy")
    french = _conclude(VALID_V2, "shorter_step", "fr", sharing="full_copy")
    assert english["verdict"] == french["verdict"] == "supported"
    assert english["sentence"] == "Shorter step: supported, 1.7× at constant global batch (data parallel (DDP))."
    assert french["sentence"] == (
        "Pas plus court : confirmé, 1,7× à lot global constant (parallélisme de données (DDP))."
    )
    assert "The way of sharing chosen at booking, data parallel (DDP): 10.0 ms per step" in english["notes"][0]
    assert "La répartition choisie à la réservation, parallélisme de données (DDP) : 10,0 ms" in french["notes"][0]
    assert any("bf16, 2048 examples, global batch 32" in note and "20 of 50" in note for note in english["notes"])
    assert any("bf16, 2048 exemples, lot global 32" in note for note in french["notes"])


def test_an_unbalanced_split_is_named_in_both_languages():
    english = _conclude(VALID_V2, "other", "en")
    french = _conclude(VALID_V2, "other", "fr")
    assert english["verdict"] == "not_tested"
    assert any(
        note.startswith("Unbalanced split with layers split (pipeline): one card's peak memory is 35.0×")
        for note in english["notes"]
    )
    assert any(
        note.startswith("Répartition déséquilibrée avec couches réparties (pipeline)") for note in french["notes"]
    )


def test_a_shorter_step_that_did_not_come_is_not_supported():
    slower = _v2(lambda r: [run.update(step_time_ms_median=19.0) for run in r["runs"][1:4]])
    conclusion = _conclude(slower, "shorter_step", "en")
    assert conclusion["verdict"] == "not_supported"
    assert "0.9× at constant global batch" in conclusion["sentence"]


def test_the_bigger_batch_compares_examples_per_second():
    english = _conclude(VALID_V2, "bigger_batch", "en")
    french = _conclude(VALID_V2, "bigger_batch", "fr")
    ratio = VALID_V2["runs"][4]["examples_per_s"] / VALID_V2["runs"][0]["examples_per_s"]  # 5818.2 / 1882.4
    assert english["verdict"] == "supported"
    assert f"supported, {ratio:.1f}× the examples per second of one card at a global batch of 64" in english["sentence"]
    assert f"confirmé, {ratio:.1f}× les exemples par seconde d'une carte".replace(".", ",") in french["sentence"]


def test_a_model_that_does_not_fit_one_card_is_possible_only_on_two():
    def too_big(report):
        for run in report["runs"]:
            if run["strategy"] in ("single", "ddp", "ddp_bigger_batch"):
                run.clear()
                run.update(strategy="single", cards=1, status="out_of_memory", global_batch=32, per_card_batch=32)
        report["runs"] = [run for run in report["runs"] if run["strategy"] != "single"]
        report["runs"].insert(
            0,
            {
                "strategy": "single",
                "cards": 1,
                "status": "out_of_memory",
                "global_batch": 32,
                "per_card_batch": 32,
                "code": "device_out_of_memory",
            },
        )

    report = _v2(too_big)
    report["findings"] = {"fits_one_card": False, "possible_only_on_two_cards": True}
    english = _conclude(report, "make_possible", "en")
    french = _conclude(report, "make_possible", "fr")
    assert english["verdict"] == "supported"
    assert english["sentence"] == (
        "Make the run possible: supported, possible only on two cards "
        "(parameters sharded (FSDP), layers split (pipeline))."
    )
    assert french["sentence"].startswith("Rendre l'entraînement possible : confirmé, possible seulement sur deux")
    shorter = _conclude(report, "shorter_step", "en")
    assert shorter["verdict"] == "not_measurable"
    assert "The model does not fit one card: possible only on two cards." in shorter["notes"]
    fits = _conclude(VALID_V2, "make_possible", "en")
    assert fits["verdict"] == "not_supported" and "fits one card" in fits["sentence"]


def test_a_version_1_report_keeps_its_own_sentence():
    legacy = _conclude(VALID, "shorter_step", "fr")
    assert legacy == {"verdict": "legacy", "sentence": VALID["conclusion"], "notes": []}
