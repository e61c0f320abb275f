"""The booking desk's rules and the errors they raise. Used by services (to refuse) and by the live quote (to
explain before the researcher submits)."""

import re
from datetime import date, datetime

from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from booking import selectors
from booking.models import (
    CHECKPOINT_INTERVAL_HOURS,
    BookingPolicy,
    EnvironmentImage,
    Hypothesis,
    Sharing,
    WindowDays,
)
from inventory.models import HardwareClass


class BookingError(Exception):
    """A booking rule said no. `message` is translated and safe to show; `field` names the form field."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class StaleTerms(BookingError):
    """The form was opened before a new terms version was published: what was accepted is not the current text."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="accept_terms")


class SoldOut(BookingError):
    def __init__(self, message: str, *, next_dates: list[date]) -> None:
        super().__init__(message, field="start_date")
        self.next_dates = next_dates


class InvalidTransition(BookingError):
    pass


class ConfirmAddressFirst(BookingError):
    """Bookings whose e-mail address is not confirmed hold the share of the class they may hold unpaid: this one
    waits until its contact confirms their address (the page offers to e-mail a link)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="contact_email")


def check_environment(*, hardware_class: HardwareClass, environment: EnvironmentImage) -> None:
    if not hardware_class.is_active:
        raise BookingError(_("This hardware class is not offered any more."), field="hardware_class")
    if not environment.is_active:
        raise BookingError(_("This environment is not offered any more."), field="environment")
    reason = environment.incompatibility_with(hardware_class)
    if reason:
        raise BookingError(reason, field="environment")
    # offered_classes() prefetches environments; elsewhere this is one query.
    if environment not in hardware_class.environments.all():
        raise BookingError(
            _("%(image)s is not offered on %(hardware)s.")
            % {"image": environment.name, "hardware": hardware_class.name},
            field="environment",
        )


def check_window(
    *, start_date: date, days: int, lot_count: int, policy: BookingPolicy, now: datetime, when_ready: bool = False
) -> None:
    """The window's length, its lots, and its start: a date within the notice and the horizon, or as soon as ready
    (the date is then not read) when the operator offers it."""
    if days not in WindowDays.values:
        raise BookingError(_("Choose a window of 3, 7 or 30 days."), field="days")
    if not 1 <= lot_count <= policy.max_lots_per_order:
        raise BookingError(_("Choose between 1 and %(most)d lots.") % {"most": policy.max_lots_per_order}, field="lots")
    if when_ready:
        if not policy.offer_start_when_ready:
            raise BookingError(_("Windows start on a date for now: choose a start date."), field="start_when_ready")
        return
    earliest = selectors.earliest_start_date(policy=policy, now=now)
    if start_date < earliest:
        raise BookingError(
            _("The earliest start is %(date)s (windows start at 00:00 UTC).") % {"date": earliest.isoformat()},
            field="start_date",
        )
    latest = selectors.latest_start_date(policy=policy, now=now)
    if start_date > latest:
        raise BookingError(
            _("Bookings open %(days)d days ahead: the latest start is %(date)s.")
            % {"days": policy.horizon_days, "date": latest.isoformat()},
            field="start_date",
        )


def check_research(
    *,
    sharing: str,
    hypothesis: str,
    detail: str,
    measure: str,
    days: int,
    checkpoint_interval_hours: int | None,
    stop_criteria: str,
) -> None:
    """The offer page's method, before renting: what the cards share, a hypothesis in the researcher's words with
    the measure that would confirm it, and for a 30-day campaign its checkpoints and stop criteria."""
    if sharing not in Sharing.values:
        raise BookingError(_("Choose what the two cards will share."), field="sharing")
    if hypothesis not in Hypothesis.values:
        raise BookingError(_("Choose a hypothesis."), field="hypothesis")
    if not detail.strip():
        raise BookingError(_("Describe your hypothesis in a few words."), field="hypothesis_detail")
    if not measure.strip():
        raise BookingError(_("Say which measure would confirm your hypothesis."), field="hypothesis_measure")
    if days == WindowDays.THIRTY:
        low, high = CHECKPOINT_INTERVAL_HOURS
        if checkpoint_interval_hours is None or not low <= checkpoint_interval_hours <= high:
            raise BookingError(
                _("A 30-day campaign checkpoints every %(low)d to %(high)d hours: give the interval.")
                % {"low": low, "high": high},
                field="checkpoint_interval_hours",
            )
        if not stop_criteria.strip():
            raise BookingError(
                _("A 30-day campaign needs its stop criteria: say when you would stop it early."),
                field="stop_criteria",
            )


CHECKPOINT_DIR_MAX = 200
# a plain name that no tool reads as an option (no leading "-")
CHECKPOINT_DIR_PART = re.compile(r"[A-Za-z0-9._@+=,][A-Za-z0-9._@+=,-]{0,99}")


def clean_checkpoint_dir(value: str) -> str:
    """A directory of the researcher's home, as they typed it ("checkpoints", "~/runs/a/ckpt", "" for none), as the
    relative path kept: plain names only (letters, digits, . _ @ + = , -, none starting with -), no "." or "..", at
    most 16 levels."""
    text = value.strip()
    if text in ("", "~", "~/"):
        return ""
    if text.startswith("~/"):
        text = text[2:]
    parts = text.strip("/").split("/") if not text.startswith("/") else []
    if (
        not parts
        or len(text) > CHECKPOINT_DIR_MAX
        or len(parts) > 16
        or any(part in (".", "..") or not CHECKPOINT_DIR_PART.fullmatch(part) for part in parts)
    ):
        raise BookingError(
            _(
                "Give the checkpoint directory inside your home, e.g. checkpoints or ~/runs/ckpt: plain names "
                "(letters, digits, . _ - @ + = ,, not starting with -) separated by /, no “..”, at most %(max)d "
                "characters."
            )
            % {"max": CHECKPOINT_DIR_MAX},
            field="checkpoint_dir",
        )
    return "/".join(parts)


def capacity_problem(*, hardware_class: HardwareClass, lot_count: int, free: int, total: int) -> str | None:
    """Why `lot_count` lots cannot be had when `free` of `total` are free, or None when they can."""
    if total < lot_count:
        return ngettext(
            "Only %(count)d lot of %(hardware)s exists.",
            "Only %(count)d lots of %(hardware)s exist.",
            total,
        ) % {"count": total, "hardware": hardware_class.name}
    if free < lot_count:
        return _("Sold out: not enough %(hardware)s lots are free for these dates.") % {"hardware": hardware_class.name}
    return None
