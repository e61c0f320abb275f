"""The pre-flight report: printed inside the customer's container (the customer can replace what prints it), so
parsed and bounded like any hostile input; and what a dry-run host reports instead."""

import json

from provisioning.step_context import StepFailed

MAX_PREFLIGHT_REPORT_BYTES = 256 * 1024
DRY_RUN_REPORT = {
    "schema": "binome.preflight/1",
    "dry_run": True,
    "checks": [{"name": "dry_run", "status": "SKIP", "reason": "dry-run driver: nothing was run on a real machine"}],
    "summary": {"status": "DRY-RUN", "passed": 0, "failed": 0, "skipped": 1, "warnings": 0},
}
_REPORT_STATUSES = {"PASS", "FAIL", "WARN", "SKIP", "DRY-RUN"}


def parse_preflight_report(stdout: str, result=None) -> dict:
    """The report printed inside the customer's container: a JSON object of bounded size and depth with a summary
    whose status is one of ours and a list of checks. Anything else fails the step with the reason (a report of
    `[]`, a deep nesting, a forged summary type) and never raises anything but StepFailed."""
    exit_note = f" (exit {result.exit_status}): {result.stderr.strip()[-300:]}" if result is not None else ""
    if len(stdout.encode(errors="replace")) > MAX_PREFLIGHT_REPORT_BYTES:
        raise StepFailed(f"the pre-flight report is larger than {MAX_PREFLIGHT_REPORT_BYTES} bytes")
    try:
        report = json.loads(stdout)
    except (ValueError, RecursionError) as exc:
        raise StepFailed(f"the pre-flight check printed no report{exit_note}") from exc
    if not isinstance(report, dict):
        raise StepFailed(f"the pre-flight report is not an object but {type(report).__name__}")
    if _depth(report) > 8:
        raise StepFailed("the pre-flight report is nested deeper than 8 levels")
    summary, checks = report.get("summary"), report.get("checks")
    if not isinstance(summary, dict) or summary.get("status") not in _REPORT_STATUSES:
        raise StepFailed("the pre-flight report has no summary with a known status")
    if not isinstance(checks, list) or not all(isinstance(check, dict) for check in checks):
        raise StepFailed("the pre-flight report's checks are not a list of objects")
    return report


def _depth(value, level: int = 1) -> int:
    if level > 8:
        return level
    if isinstance(value, dict):
        return max([_depth(item, level + 1) for item in value.values()], default=level)
    if isinstance(value, list):
        return max([_depth(item, level + 1) for item in value], default=level)
    return level
