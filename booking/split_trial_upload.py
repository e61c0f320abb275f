"""The upload of a split-trial report: kept with its order once booking/split_trial_report.py validated it, or
refused with the reason in the customer's language (a message per code of InvalidReport)."""

from django.utils.translation import gettext, gettext_lazy

from booking.models import Order, SplitTrialReport
from booking.report_schema import InvalidReport
from booking.rules import BookingError
from booking.split_trial_report import parse_report


def split_trial_upload(*, order: Order, raw: bytes):
    """Keep a split-trial kit report with the order, once it has been validated field by field."""
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
