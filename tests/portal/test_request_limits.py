"""Bodies and uploads are bounded by settings sized to the forms, lengths are refused before any pattern runs, and
every pattern on user input gives its answer on megabytes of the shapes that made them slow: the attacks of issue
13, replayed. What each refusal costs is counted (bytes read from the body, text searched by a pattern), not timed;
the patterns' time, twice the input for about twice the time, is `bench/patterns.py`'s."""

import multiprocessing
from urllib.parse import urlencode

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from booking import report_schema
from booking.models import Order, OrderStatus, SplitTrialReport
from booking.services import order_transition
from tests.builders.orders import place
from web.customer.forms import BookingForm, FitForm, no_markup

pytestmark = pytest.mark.django_db


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


def test_a_body_over_the_limit_is_refused_with_413_before_it_is_read(client, catalog, booking_data, body_reads):
    data = booking_data(notes="a" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    response = client.post(reverse("customer:book"), data)
    assert response.status_code == 413
    assert "larger than any form of this site accepts" in response.content.decode()
    assert sum(body_reads) == 0 and not Order.objects.exists()


def test_the_issue_13_notes_are_answered_at_once_with_a_length_error(client, catalog, booking_data, pattern_reads):
    """`<`, 80,000 spaces and `1` took 30 s and killed the worker; now the length is refused before the pattern."""
    response = client.post(reverse("customer:book"), booking_data(notes="<" + " " * 80_000 + "1"))
    assert response.status_code == 200 and not Order.objects.exists()
    assert "at most 4000 characters" in response.content.decode()
    # The other fields went through their patterns; the 80,001 characters went through none.
    assert pattern_reads.calls and pattern_reads.longest() <= BookingForm.base_fields["notes"].max_length


@pytest.mark.parametrize(
    "pattern_check",
    [no_markup, lambda text: report_schema.MARKUP.search(text)],
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
def test_markup_patterns_answer_on_two_megabytes_of_the_slow_shapes(pattern_check, shape):
    """Each shape on 2 MB is no markup, and a tag after it is found: the pattern reads it all and answers. A pattern
    that backtracks (quadratic) would take hours here: the check runs in a child process, killed if it ever hangs.
    The time itself (twice the input, about twice the time) is `bench/patterns.py`'s figure, PASS or FAIL."""
    text = shape(2_000_000)
    assert _markup_found_in_a_child(pattern_check, [text, text + "<b>"]) == [False, True]


HANG_S = 120  # a linear pattern answers in milliseconds, a quadratic one in hours: only a real hang gets here


def _markup_found(pattern_check, text: str) -> bool:
    try:
        return pattern_check(text) is not None
    except ValidationError:
        return True


def _markup_found_in_a_child(pattern_check, texts: list[str]) -> list[bool]:
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=lambda: sender.send([_markup_found(pattern_check, text) for text in texts]))
    child.start()
    try:
        assert receiver.poll(HANG_S), f"the pattern gave no answer on {len(texts[0]):,} characters: it backtracks"
        return receiver.recv()
    finally:
        child.kill()
        child.join()


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
    client, catalog, booking_data, disk_spills, body_reads, size
):
    order, token = _ready_order(client, booking_data)
    url = reverse("customer:order-split-trial", kwargs={"public_id": order.public_id, "token": token})
    report = SimpleUploadedFile("report.json", b'{"x": "' + b"a" * size + b'"}')
    body_reads.clear()
    response = client.post(url, {"report": report})
    assert response.status_code == 413 and sum(body_reads) == 0
    assert disk_spills == [] and not SplitTrialReport.objects.exists()


def test_a_report_over_its_size_but_under_the_body_limit_is_read_in_memory_and_refused(
    client, catalog, booking_data, disk_spills
):
    order, token = _ready_order(client, booking_data)
    url = reverse("customer:order-split-trial", kwargs={"public_id": order.public_id, "token": token})
    report = SimpleUploadedFile("report.json", b"[" * 257_000)
    response = client.post(url, {"report": report}, follow=True)
    assert response.status_code == 200 and "This report is too large" in response.content.decode()
    assert disk_spills == [] and not SplitTrialReport.objects.exists()
