"""A customer whose access was handed over before the window starts (provisioning hands it over up to
`provision_lead_hours` before: READY) cancels by the started window's rule: no refund, and the cancel button says
so (booking/cancellation.py). Found by issue 32's red team: the customer used the GPUs for hours, then cancelled
for the percentage of the whole price."""

from datetime import timedelta

import pytest
from django.urls import reverse

from booking.cancellation import refund_quote
from booking.models import OrderStatus
from payments.models import Refund

pytestmark = pytest.mark.django_db


def test_a_customer_handed_over_access_cancels_for_a_refund(machine):
    """provisioning hands the access over up to `provision_lead_hours` (6) before the
    window starts (provisioning/lifecycle.py `_provision_due`, execution.py `_hand_over`: READY, access e-mail),
    and a READY order is still cancellable with a refund (booking/models.py PAID_CANCELLABLE_STATUSES,
    cancellation.py: the percentage until the start). The customer uses the GPUs for up to 6 hours, then cancels
    and is refunded the percentage of the whole price: money that bought a window they already used."""
    machine.place_order("ready")
    order = machine.fresh()
    assert order.status == OrderStatus.READY
    from booking.cancellation import refund_quote

    just_before_start = order.starts_at - timedelta(hours=1)
    assert refund_quote(order=order, now=just_before_start).amount == 0, (
        f"handed over, and {refund_quote(order=order, now=just_before_start).amount} refunded on a cancel an hour "
        "before the start"
    )


def test_the_cancel_button_of_a_handed_over_order_shows_what_the_cancellation_gives(machine):
    # given: a paid order handed over before its window starts
    machine.place_order("ready")
    order = machine.fresh()
    assert order.status == OrderStatus.READY and order.starts_at > machine.now
    # when: its customer opens the order page
    page = machine.fixtures["client"].get(order_url(machine)).content.decode()
    # then: the button says no refund, with the reason, and cancelling gives none
    assert "Cancel without refund" in page and "your access has been handed over" in page
    assert 'name="refund_shown" value="0.00"' in page
    machine.cancel("customer")
    assert machine.fresh().status == OrderStatus.CANCELLED
    assert not Refund.objects.filter(order=order, reason=Refund.Reason.CANCELLATION).exists()


def test_an_order_paid_and_not_handed_over_keeps_its_refund(machine):
    machine.place_order("paid")
    order = machine.fresh()
    assert order.status in (OrderStatus.PAID, OrderStatus.APPROVED)
    assert refund_quote(order=order, now=order.starts_at - timedelta(hours=1)).amount > 0


def order_url(machine) -> str:
    return reverse("customer:order", kwargs={"public_id": machine.order.public_id, "token": machine.token})
