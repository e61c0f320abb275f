"""The terms versions: the current one (what the booking form asks to accept), publishing a draft, and a new draft
started from a published version (a published version never changes: booking/models.py TermsVersion)."""

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from booking import availability
from booking.models import TermsPublished, TermsVersion
from booking.terms_demo import FIRST_VERSION

_COPIED_FIELDS = (*FIRST_VERSION, "full_refund_days_before", "cancellation_fee", "partial_refund_percent")


def terms_current() -> TermsVersion | None:
    """The published version with the highest number, kept in memory until a version is saved (the shared
    generation)."""
    return availability.remember_in_process("booking:terms:current", _read_current)


def _read_current() -> TermsVersion | None:
    return TermsVersion.objects.filter(published_at__isnull=False).order_by("-number").first()


def terms_version_by_number(*, number: int) -> TermsVersion | None:
    return TermsVersion.objects.filter(number=number, published_at__isnull=False).first()


@transaction.atomic
def terms_publish(*, version: TermsVersion) -> TermsVersion:
    """Give a draft the next number and make it the current version (from then on it never changes). The table is
    locked so two publications cannot take one number (the unique constraint is the guarantee behind it)."""
    draft = TermsVersion.objects.select_for_update().get(pk=version.pk)
    if draft.published_at is not None:
        raise TermsPublished(f"terms version {draft.number} is already published")
    TermsVersion.objects.select_for_update().filter(published_at__isnull=False).order_by("-number").first()
    number = (TermsVersion.objects.aggregate(last=Max("number"))["last"] or 0) + 1
    TermsVersion.objects.filter(pk=draft.pk).update(number=number, published_at=timezone.now())
    availability.bump_generation()  # the booking page and its footer name the current version
    draft.refresh_from_db()
    return draft


def terms_draft_from(*, version: TermsVersion) -> TermsVersion:
    """A new draft with the texts and cancellation rules of `version`, to edit then publish."""
    return TermsVersion.objects.create(**{name: getattr(version, name) for name in _COPIED_FIELDS})


def terms_seed_demo() -> TermsVersion:
    """The demo's first version when no version is published (a test database flushed after a browser test)."""
    current = _read_current()
    if current is not None:
        return current
    version = TermsVersion.objects.create(**FIRST_VERSION)
    return terms_publish(version=version)
