"""Bodies and uploads are bounded by settings sized to the forms, lengths are refused before any pattern runs, and
every pattern on user input runs in linear time: the attacks of issue 13, replayed."""

import time
from urllib.parse import urlencode

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from booking import split_trial_report
from booking.models import Order, OrderStatus, SplitTrialReport
from booking.services import order_transition
from tests.booking.test_pages import place
from web.customer.forms import BookingForm, FitForm, no_markup

pytestmark = pytest.mark.django_db


def _timed(call):
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def test_the_body_limit_fits_the_largest_valid_booking_and_nothing_much_larger():
    # Every text field at its max_length in 4-byte characters, percent-encoded: 12 bytes a character.
    widest = {
        name: "💥" * field.max_length
        for name, field in BookingForm.base_fields.items()
        if getattr(field, "max_length", None)
    }
    others = {name: "x" * 40 for name in BookingForm.base_fields if name not in widest}
    fit = {f"fit-{name}": "1" * 20 for name in FitForm.base_fields}
    body = urlencode({**widest, **others, **fit, "csrfmiddlewaretoken": "t" * 64}).encode()
    assert len(body) <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE < 1.2 * len(body) < 2_500_000


def test_a_booking_with_every_text_at_its_longest_in_emoji_is_placed(client, booking_data):
    order, _token = place(client, booking_data(notes="💥" * 4000, hypothesis_detail="é" * 2000))
    assert order.notes == "💥" * 4000


def test_a_body_over_the_limit_is_refused_with_413_before_it_is_read(client, catalog, booking_data):
    data = booking_data(notes="a" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    response, elapsed = _timed(lambda: client.post(reverse("booking:book"), data))
    assert response.status_code == 413
    assert "larger than any form of this site accepts" in response.content.decode()
    assert elapsed < 1.0 and not Order.objects.exists()


def test_the_issue_13_notes_are_answered_at_once_with_a_length_error(client, catalog, booking_data):
    """`<`, 80,000 spaces and `1` took 30 s and killed the worker; now the length is refused before the pattern."""
    response, elapsed = _timed(
        lambda: client.post(reverse("booking:book"), booking_data(notes="<" + " " * 80_000 + "1"))
    )
    assert response.status_code == 200 and not Order.objects.exists()
    assert "at most 4000 characters" in response.content.decode()
    assert elapsed < 1.0


@pytest.mark.parametrize(
    "pattern_check",
    [no_markup, lambda text: split_trial_report._MARKUP.search(text)],
    ids=["booking-forms", "split-trial-report"],
)
@pytest.mark.parametrize(
    "shape",
    [
        lambda n: "<" + " " * n + "1",
        lambda n: "< " * (n // 2),
        lambda n: "<" + " " * (n // 2) + "/" + " " * (n // 2) + "1",
        lambda n: "&#" + "a" * n,
    ],
    ids=["spaces", "many-opens", "slash", "entity"],
)
def test_markup_patterns_run_in_linear_time(pattern_check, shape):
    """Twice the input, about twice the time (a quadratic pattern takes four times): measured on 1 and 2 MB."""
    timings = []
    for size in (1_000_000, 2_000_000):
        text = shape(size)
        _result, elapsed = _timed(lambda text=text: pattern_check(text))
        timings.append(elapsed)
    assert timings[1] < 0.5, timings
    assert timings[1] < 3 * timings[0] + 0.05, timings


def _ready_order(client, booking_data):
    order, token = place(client, booking_data(lots="1"))
    for status in (OrderStatus.PAID, OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    return order, token


@pytest.fixture
def disk_spills(monkeypatch) -> list:
    """Every upload Django would write to a temporary file on disk."""
    from django.core.files import uploadhandler

    spills = []
    real = uploadhandler.TemporaryUploadedFile

    def spy(*args, **kwargs):
        spills.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(uploadhandler, "TemporaryUploadedFile", spy)
    return spills


@pytest.mark.parametrize("size", [3_000_000, 300_000])
def test_an_oversized_report_upload_is_refused_before_it_is_written_to_disk(
    client, catalog, booking_data, disk_spills, size
):
    order, token = _ready_order(client, booking_data)
    url = reverse("booking:order-split-trial", kwargs={"public_id": order.public_id, "token": token})
    report = SimpleUploadedFile("report.json", b'{"x": "' + b"a" * size + b'"}')
    response, elapsed = _timed(lambda: client.post(url, {"report": report}))
    assert response.status_code == 413 and elapsed < 1.0
    assert disk_spills == [] and not SplitTrialReport.objects.exists()


def test_a_report_over_its_size_but_under_the_body_limit_is_read_in_memory_and_refused(
    client, catalog, booking_data, disk_spills
):
    order, token = _ready_order(client, booking_data)
    url = reverse("booking:order-split-trial", kwargs={"public_id": order.public_id, "token": token})
    report = SimpleUploadedFile("report.json", b"[" * 257_000)
    response = client.post(url, {"report": report}, follow=True)
    assert response.status_code == 200 and "This report is too large" in response.content.decode()
    assert disk_spills == [] and not SplitTrialReport.objects.exists()
