"""Beat's sweep (payments/refunds.py `ledger_sweep`) selects what the ledger says needs a repair, so that a newer
lost reaction is always repaired. Found by issue 32's red team: an order whose whole price went back for a provider
fault, then cancelled by an operator (no cancellation refund: nothing was left), was selected on every run, oldest
first, 200 at most; 200 such orders hid every newer lost reaction."""

import pytest

from booking import services as booking_services
from booking.models import OrderStatus
from payments import refunds
from payments.models import Refund
from tests.payments.money_life import capture

pytestmark = pytest.mark.django_db


def test_an_order_with_nothing_left_to_refund_is_not_swept_again_and_again(machine, monkeypatch):
    """a window whose whole price went back for a provider fault, then cancelled by an
    operator, opens no cancellation refund (nothing is left of the price: `refund_open` returns None). The
    sweep's "lost reaction" query (refunds.py `ledger_sweep`: cancelled, refund_due null, a taken invoice, no
    cancellation refund) then selects it on every run, oldest first, 200 at most: once 200 such orders exist, a
    reaction really lost on a newer order is never repaired."""
    machine.place_order("ready")
    machine.provider_fault("money", 168)  # a 3-day window: the whole price goes back
    machine.cancel("operator")
    calls = []
    original = refunds.refunds_open_for_order

    def spy(*, order_id):
        calls.append(order_id)
        return original(order_id=order_id)

    monkeypatch.setattr(refunds, "refunds_open_for_order", spy)
    with capture():
        refunds.ledger_sweep(now=machine.now)
    assert calls == [], f"swept again, nothing to repair: {calls}"


def test_a_newer_lost_reaction_is_repaired_behind_an_order_with_nothing_left(machine):
    # given: an older order with nothing left to refund, and a newer paid order cancelled by an operator whose
    # refund reaction was lost (the worker stopped after the commit)
    machine.place_order("ready")
    machine.provider_fault("money", 168)
    machine.cancel("operator")
    machine.place_order("paid")
    lost = machine.fresh()
    assert lost.status == OrderStatus.PAID
    with capture(execute=False):  # the reaction is never run
        booking_services.order_cancel_by_operator(order=lost, actor=machine.fixtures["admin"], reason="test")
    assert not Refund.objects.filter(order=lost).exists()
    # when: the sweep runs with room for one order only
    with capture(execute=False):
        refunds.ledger_sweep(now=machine.now, batch_size=1)
    # then: the newer order's refund is opened
    assert list(Refund.objects.filter(order=lost).values_list("reason", flat=True)) == [Refund.Reason.CANCELLATION]
