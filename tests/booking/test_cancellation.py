"""A paid order cancelled by its customer: the refund the accepted terms give is shown before confirming, the lots
are released at once, and the refund is recorded as owed (the invoice is flagged for the operators)."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from booking.models import Allocation, Order, OrderStatus
from booking.rules import BookingError
from booking.services import order_cancel_by_customer
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid

pytestmark = pytest.mark.django_db


def paid_order(client, booking_data, admin_user, django_capture_on_commit_callbacks) -> tuple[Order, str]:
    response = client.post(reverse("customer:book"), booking_data(lots="2"))
    order = Order.objects.get()
    with django_capture_on_commit_callbacks(execute=True):
        invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    return order, response["Location"]


def test_cancelled_early_a_paid_order_is_refunded_in_full_less_the_fee_and_its_lots_are_released(
    client, catalog, booking_data, admin_user, rules, django_capture_on_commit_callbacks, mailoutbox
):
    rules(days=3, fee="25.00", percent=40)
    order, url = paid_order(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    expected = order.total_price - Decimal("25.00")

    page = client.get(url).content.decode()
    assert f"Cancel and be refunded {expected} EUR" in page.replace("\u202f", "").replace(",", "")
    assert f'name="refund_shown" value="{expected}"' in page

    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(
            reverse(
                "customer:order-cancel", kwargs={"public_id": order.public_id, "token": url.rstrip("/").split("/")[-1]}
            ),
            {"refund_shown": str(expected)},
            follow=True,
        )

    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED and order.refund_due == expected
    assert not Allocation.objects.filter(order=order, released_at__isnull=True).exists()
    assert order.refunds.get().status == "awaiting_address"  # the refund owed is in the refunds queue
    assert "are owed back to you" in answer.content.decode()
    event = order.events.get(from_status=OrderStatus.PAID, to_status=OrderStatus.CANCELLED)
    assert event.evidence["refund_due"] == str(expected) and event.evidence["rule"] == "full"
    # the customer has it in writing, and the operator sees the amount owed on the console
    (mail,) = [message for message in mailoutbox if "is cancelled" in message.subject]
    assert mail.to == [order.contact_email] and f"{expected} EUR are owed back to you" in mail.body
    client.force_login(admin_user)
    console = client.get(reverse("console:order", kwargs={"public_id": order.public_id})).content.decode()
    assert "Refund due" in console and f"{expected} EUR" in console


def test_a_refund_that_changed_since_the_page_was_drawn_is_not_applied(
    client, catalog, booking_data, admin_user, rules, django_capture_on_commit_callbacks
):
    rules(days=60, fee="25.00", percent=40)  # the start is less than 60 days away: 40 % until it
    order, url = paid_order(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    partial = (order.total_price * Decimal("0.40")).quantize(Decimal("0.01"))
    assert f'name="refund_shown" value="{partial}"' in client.get(url).content.decode()

    with pytest.raises(BookingError, match=f"it is now {partial} EUR"):
        order_cancel_by_customer(order=order, refund_shown=order.total_price - Decimal("25.00"))
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID and order.refund_due is None

    order_cancel_by_customer(order=order, refund_shown=partial)
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED and order.refund_due == partial


def test_once_the_window_has_started_cancelling_refunds_nothing_and_flags_no_refund(
    client, catalog, booking_data, admin_user, rules, django_capture_on_commit_callbacks
):
    rules(days=3, fee="0", percent=40)
    order, _url = paid_order(client, booking_data, admin_user, django_capture_on_commit_callbacks)

    with django_capture_on_commit_callbacks(execute=True):
        order_cancel_by_customer(order=order, refund_shown=Decimal("0"), now=order.starts_at + timedelta(hours=1))

    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED and order.refund_due == Decimal("0")
    assert not order.refunds.exists()


def test_an_unpaid_order_still_cancels_without_any_refund(client, catalog, booking_data):
    client.post(reverse("customer:book"), booking_data())
    order = Order.objects.get()
    order_cancel_by_customer(order=order)
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED and order.refund_due is None


def test_the_policy_page_states_the_rules_in_the_page_language(client, catalog, rules):
    rules(days=14, fee="30.00", percent=25)

    english = client.get("/terms/cancellation/").content.decode()
    assert "Until 14 days before the window starts: full refund, less a cancellation fee of 30.00 EUR." in english
    assert "After that, until the window starts: 25% of the price is refunded." in english

    client.cookies["django_language"] = "fr"
    french = client.get("/terms/cancellation/").content.decode()
    assert "Jusqu'à 14 jours avant le début de la fenêtre" in french.replace("&#x27;", "'")
