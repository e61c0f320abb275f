"""A flagged payment leaves the console's queue once the ledger says nothing of it waits for an operator
(payments/refunds.py `invoice_unflag_if_nothing_waits`): refunded by a cancellation's reaction, or found by the
sweep. Found by issue 32's red team: the flag stayed for ever, both actions refused, nothing cleared it."""

from datetime import timedelta

import pytest

from booking import services as booking_services
from booking.models import OrderStatus
from payments import refunds, selectors, unapplied
from payments.errors import PaymentError
from payments.models import Invoice, Refund
from tests.payments.money_life import capture

pytestmark = pytest.mark.django_db


def test_a_flagged_payment_refunded_by_the_cancellation_stays_in_the_queue_for_ever(machine):
    """An extension paid in part after its hold ran out is flagged (settlement.py, "partial payment
    after the hold expired"). The operator then cancels the order: the cancellation's reaction refunds that part
    (`refunds_open_for_order` → `refund_unaccounted`) but leaves `needs_operator` set. The payment stays in the
    console's flagged queue for ever, showing 0 "not owed back yet": "Refund" answers that nothing is left,
    "Apply" that the order is cancelled, and nothing else clears it. Each such entry is also one of the 100 the
    queue shows (see the dust test above)."""
    machine.place_order("ready")
    order = machine.fresh()
    from payments import checkout

    with capture(execute=False):
        extension = checkout.order_extension_request(order=order, days=3, actor=None, now=machine.now)
    machine.now = machine.fresh().extension_held_until + timedelta(days=1)
    with capture(execute=False):
        booking_services.extension_holds_release(now=machine.now)
    machine.credit(extension, int(extension.amount_due_units) // 3, late=True)
    extension.refresh_from_db()
    assert extension.needs_operator
    machine.cancel("operator")
    extension.refresh_from_db()
    assert Refund.objects.filter(invoice=extension).exists()  # the part goes back by itself
    for service in (unapplied.invoice_refund_unapplied, unapplied.invoice_apply_to_order):
        with pytest.raises(PaymentError):
            service(invoice=extension, actor=machine.fixtures["admin"], now=machine.now)
    shown = {view.invoice.pk: view.unapplied for view in selectors.flagged_payments()}
    assert extension.pk not in shown, f"still in the flagged queue, {shown.get(extension.pk)} left, no way out"


def test_a_part_paid_to_a_replaced_quote_and_refunded_by_the_cancellation_stays_flagged(machine):
    """The same stale flag, from the customer's side: a part paid to a replaced quote (flagged),
    the current quote paid, the order cancelled by its customer. The part is refunded by the cancellation's
    reaction, and the replaced quote waits in the flagged queue for ever with 0 left."""
    machine.place_order("unpaid")
    machine.can_switch_asset = True
    machine.pay_the_replaced_quote("part")
    replaced = Invoice.objects.get(order=machine.order, status=Invoice.Status.INVALID)
    assert replaced.needs_operator
    current = machine.open_invoice(Invoice.Purpose.ORDER)
    machine.credit(current, int(current.amount_due_units))
    assert machine.fresh().status == OrderStatus.PAID
    machine.cancel("customer")
    replaced.refresh_from_db()
    assert unapplied.unapplied_units(replaced) == 0  # refunded by the cancellation
    assert not replaced.needs_operator, "refunded, and still in the flagged queue with no action that clears it"


def test_the_sweep_clears_a_flag_that_nothing_waits_behind(machine):
    """A flag left behind by a reaction of an earlier version (or set by hand) on a payment refunded in full: beat's
    sweep takes it out of the queue, and leaves a flag with money behind it alone."""
    machine.place_order("unpaid")
    machine.can_switch_asset = True
    machine.pay_the_replaced_quote("part")
    replaced = Invoice.objects.get(order=machine.order, status=Invoice.Status.INVALID)
    other = Invoice.objects.get(pk=replaced.pk)
    assert replaced.needs_operator
    with capture(execute=False):
        refunds.ledger_sweep(now=machine.now)
    assert Invoice.objects.get(pk=replaced.pk).needs_operator  # its money still waits: the flag stays
    with capture(execute=False):
        unapplied.invoice_refund_unapplied(invoice=other, actor=machine.fixtures["admin"], now=machine.now)
    Invoice.objects.filter(pk=replaced.pk).update(needs_operator=True)  # stale: all of it is owed back
    assert replaced.pk in {view.invoice.pk for view in selectors.flagged_payments()}
    with capture(execute=False):
        refunds.ledger_sweep(now=machine.now)
    assert not Invoice.objects.get(pk=replaced.pk).needs_operator
    assert replaced.pk not in {view.invoice.pk for view in selectors.flagged_payments()}
    assert Refund.objects.filter(invoice=replaced).count() == 1
