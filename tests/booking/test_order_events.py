"""An order's history is shown a page at a time: the order page and the console's show the latest events, with a
link to the older ones. An order's trail has no bound (a transfer reorganised back and forth, links revoked, an
operator's notes), and the order page is drawn again on every change."""

import re

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from booking import services
from booking.models import OrderEvent, OrderStatus
from booking.selectors import EVENTS_PER_PAGE
from tests.builders.orders import order_url, place

pytestmark = pytest.mark.django_db

REORGS = 60  # 120 transitions: the transfer seen, then dropped by a reorganisation, 60 times


def _reorganised_back_and_forth(order) -> None:
    for round_number in range(REORGS):
        services.order_transition(
            order=order, to_status=OrderStatus.PAYMENT_PROCESSING, actor_kind="system", reason=f"seen {round_number}"
        )
        services.order_transition(
            order=order, to_status=OrderStatus.AWAITING_PAYMENT, actor_kind="system", reason=f"reorg {round_number}"
        )


def _shown(page: str) -> list[str]:
    """The timeline's entries, as the customer reads them (status changes, oldest first)."""
    timeline = re.search(r'<ol class="timeline">(.*?)</ol>', page, re.S)[1]
    return [
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", item)).strip()
        for item in re.findall(r"<li>(.*?)</li>", timeline, re.S)
    ]


def _older_link(page: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" class="older-events">', page)
    return found[1].replace("&amp;", "&") if found else None


@pytest.fixture
def busy_order(client, catalog, booking_data):
    order, token = place(client, booking_data())
    _reorganised_back_and_forth(order)
    for index in range(30):  # notes: in the console's history, not the customer's
        services.order_note(order=order, reason=f"note {index}", actor_kind="operator")
    assert order.events.count() == 1 + 2 * REORGS + 30
    return order, token


def test_the_order_page_shows_the_latest_changes_and_pages_back_to_the_first(
    client, busy_order, django_assert_max_num_queries
):
    order, token = busy_order

    with django_assert_max_num_queries(30):
        page = client.get(order_url(order, token)).content.decode()

    shown = _shown(page)
    assert len(shown) == EVENTS_PER_PAGE
    assert shown[-1].endswith("Payment being confirmed → Awaiting payment")  # the latest, last
    seen = list(shown)
    link = _older_link(page)
    while link:
        older = client.get(link)
        assert older.status_code == 200 and older["Referrer-Policy"] == "same-origin"
        text = older.content.decode()
        seen = _shown(text) + seen
        link = _older_link(text)
    assert len(seen) == 1 + 2 * REORGS  # every status change once, none of the notes
    assert seen[0].endswith("Awaiting payment") and "→" not in seen[0]  # the booking itself, first


def test_the_console_shows_the_latest_events_notes_included_and_pages_back(busy_order, django_user_model):
    order, _ = busy_order
    operator = django_user_model.objects.create_user("olga", password="a-long-operator-password", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="operate_orders"))
    console = Client()
    console.force_login(operator)

    page = console.get(reverse("console:order", kwargs={"public_id": order.public_id})).content.decode()

    history = re.search(r'<ol class="timeline">(.*?)</ol>', page, re.S)[1]
    assert history.count("<li>") == EVENTS_PER_PAGE
    # the latest 50: the 20 last transitions (seen 50 … reorg 59), then the 30 notes
    assert "seen 50" in history and "note 29" in history and "reorg 49" not in history
    reasons = []
    link = _older_link(page)
    while link:
        text = console.get(link).content.decode()
        reasons = re.findall(r"· ([a-z]+ [0-9]+)</li>", text) + reasons
        link = _older_link(text)
    assert reasons[:2] == ["seen 0", "reorg 0"] and reasons[-1] == "reorg 49" and len(reasons) == 2 * 50


def test_a_page_of_another_order_s_event_or_a_junk_cursor_shows_nothing_of_it(client, busy_order, booking_data):
    order, _ = busy_order
    other, other_token = place(client, booking_data(contact_email="grace@example.org"))
    foreign = OrderEvent.objects.filter(order=order).last().pk

    for before in (str(foreign), "²", "-1", "9" * 40):
        response = client.get(
            reverse("customer:order-events", kwargs={"public_id": other.public_id, "token": other_token}),
            {"before": before},
        )
        assert response.status_code == 200
        assert "reorg" not in response.content.decode() and "Payment being confirmed" not in response.content.decode()


def test_the_older_events_need_the_order_s_link(client, busy_order):
    order, _ = busy_order
    response = client.get(reverse("customer:order-events", kwargs={"public_id": order.public_id, "token": "wrong"}))
    assert response.status_code == 404
    console = client.get(reverse("console:order-events", kwargs={"public_id": order.public_id}))
    assert console.status_code == 302  # to the sign-in
