"""The public availability calendar: per class, eight weeks of free lot counts for the chosen window, linked from the
booking page and filling its start date; counts only, and any query string draws it."""

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from booking import selectors
from booking.models import BookingPolicy
from tests.builders.orders import place

pytestmark = pytest.mark.django_db


def cells(page: str) -> dict[str, str]:
    """Date → the text of its cell (the link's target appended when the day is bookable)."""
    found = {}
    for cell in re.findall(r"<td class=\"[a-z]+\">(.*?)</td>", page, re.S):
        day = re.search(r'<span class="date">(\d{4}-\d\d-\d\d)</span>', cell)
        count = re.search(r'<span class="count">([^<]*)</span>', cell)
        link = re.search(r'href="([^"]+)"', cell)
        found[day[1]] = count[1].strip() + (f" -> {html.unescape(link[1])}" if link else "")
    return found


def test_the_calendar_counts_free_lots_per_start_date_and_books_from_a_day(client, catalog, booking_data, start_date):
    order, _token = place(client, booking_data(lots="2", days="7"))  # 2 of the 6 B200 lots from start_date
    page = client.get(reverse("customer:calendar"), {"hardware_class": "b200-pair", "days": "7", "lots": "5"})
    text = page.content.decode()
    days = cells(text)

    today = datetime.now(UTC).date()
    assert len(days) == 56 and min(days) == today.isoformat()
    earliest = selectors.earliest_start_date(policy=BookingPolicy.current())
    assert days[today.isoformat()] == "too soon" or earliest == today
    # a 7-day window from any of the 7 days before the order (turnaround included) or during it meets the order
    assert days[start_date.isoformat()] == "4 free"
    assert days[(start_date - timedelta(days=6)).isoformat()] == "4 free"
    free_after = (order.ends_at + 2 * BookingPolicy.current().turnaround).date() + timedelta(days=1)
    assert days[free_after.isoformat()] == (
        f"6 free -> /?hardware_class=b200-pair&days=7&lots=5&start_date={free_after.isoformat()}"
    )
    # nothing of whose lots they are
    assert order.public_id not in text and "ada@example.org" not in text and "b200-node" not in text

    # the link fills the booking page's choices
    booking = client.get(days[free_after.isoformat()].split(" -> ")[1]).content.decode()
    assert f'value="{free_after.isoformat()}"' in booking
    assert re.search(r'<input type="number" name="lots" value="5"', booking)


def test_the_booking_page_links_the_calendar_with_its_choices(client, catalog):
    page = html.unescape(client.get(reverse("customer:book")).content.decode())
    assert "/calendar/?hardware_class=b200-pair&days=7&lots=1" in page


@pytest.mark.parametrize(
    "query",
    [
        {"hardware_class": "<script>alert('x')</script>", "days": "99", "lots": "-1"},
        {"hardware_class": "x" * 100_000, "days": "9" * 5000, "lots": "9" * 5000},
        {"lots": "1e9", "days": "7.0"},
        {"lots": "100"},
    ],
)
def test_any_query_string_draws_the_default_choices(client, catalog, query):
    response = client.get(reverse("customer:calendar"), query)
    assert response.status_code == 200
    text = response.content.decode()
    assert "<script>alert" not in text
    assert "NVIDIA B200 pair: lots free for 7 days from each date (you asked for 1 lot)" in text
    assert len(cells(text)) == 56


def test_the_french_calendar_is_in_french(client, catalog):
    client.cookies["django_language"] = "fr"
    text = client.get(reverse("customer:calendar"), {"hardware_class": "h200-pair", "days": "3"}).content.decode()
    assert "Quand les lots sont libres" in text
    assert "lundi" in text.lower()
