"""The pre-flight report comes from inside the customer's container: the customer can replace what prints it. Every
shape that is not a report is a failed step with a reason, never an exception that re-queues the run for ever."""

import json

import pytest

from provisioning.preflight_report import MAX_PREFLIGHT_REPORT_BYTES, parse_preflight_report
from provisioning.step_context import StepFailed

GOOD = {
    "schema": "binome.preflight/1",
    "checks": [{"name": "gpu_visible", "status": "FAIL"}],
    "summary": {"status": "FAIL"},
}


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize(
    ("printed", "reason"),
    [
        ("", "printed no report"),
        ("not json", "printed no report"),
        ("[]", "is not an object but list"),
        ("null", "is not an object but NoneType"),
        ('"PASS"', "is not an object but str"),
        (json.dumps({**GOOD, "summary": "PASS"}), "no summary with a known status"),
        (json.dumps({**GOOD, "summary": {"status": "EXCELLENT"}}), "no summary with a known status"),
        (json.dumps({**GOOD, "checks": "all good"}), "checks are not a list of objects"),
        (json.dumps({**GOOD, "checks": [1, 2]}), "checks are not a list of objects"),
        (nested(50), "nested deeper than 8 levels"),
        (nested(20_000), "nested deeper|printed no report"),  # however deep: a failed step, never a RecursionError
        (json.dumps({**GOOD, "pad": "x" * MAX_PREFLIGHT_REPORT_BYTES}), "larger than"),
    ],
)
def test_a_report_that_is_not_one_fails_the_step_with_its_reason(printed, reason):
    with pytest.raises(StepFailed, match=reason):
        parse_preflight_report(printed)


def test_a_well_formed_report_is_kept_as_it_is():
    assert parse_preflight_report(json.dumps(GOOD)) == GOOD
