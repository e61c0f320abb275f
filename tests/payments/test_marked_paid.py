"""An invoice an admin marked paid by another route (a bank transfer) received its amount due off chain: chain
money on top of it bought nothing, and waits for an operator, who knows whether the customer paid twice
(payments/ledger.py `invoice_received_units`, settlement.py). Found by issue 32's red team: it was kept in
silence, only an order note said it arrived. A transfer the chain showed when the invoice was marked (late to
confirm) is the one the mark was for, and counts toward it."""

import pytest

from payments import ledger, refunds, selectors, settlement, unapplied
from payments.models import Invoice, Refund
from tests.payments.money_life import capture

pytestmark = pytest.mark.django_db


def test_a_chain_payment_to_an_invoice_marked_paid_by_bank_is_not_kept_in_silence(machine):
    """An admin marks an invoice paid "by bank transfer" (the reason the project's own tests use);
    the customer, unsure, also pays it on chain. `invoice_apply_chain_state` (settlement.py, the SETTLED branch)
    counts the transfer "toward" the marked invoice when it does not exceed the amount due, and the ledger counts
    a marked invoice's receipts as max(on chain, amount due): the second payment of the full price is neither
    bought time, refunded, nor in front of an operator; only an order note says it arrived."""
    machine.place_order("unpaid")
    invoice = machine.open_invoice(Invoice.Purpose.ORDER)
    from payments import settlement

    with capture(execute=False):
        settlement.invoice_mark_paid(invoice=invoice, user=machine.fixtures["admin"], reason="paid by bank transfer")
    machine.credit(invoice, int(invoice.amount_due_units))
    invoice.refresh_from_db()
    owed = sum((int(r.amount_units) for r in Refund.objects.filter(invoice=invoice)), 0)
    assert invoice.needs_operator or owed == int(invoice.amount_due_units), (
        f"paid twice (bank, and {invoice.amount_confirmed_units} units on chain): refunds {owed}, not flagged"
    )


def test_a_chain_payment_on_top_of_a_bank_transfer_waits_for_the_operator_who_refunds_it(machine):
    # given: an order paid by bank transfer (marked paid), then paid in full on chain too
    machine.place_order("unpaid")
    invoice = machine.open_invoice(Invoice.Purpose.ORDER)
    with capture(execute=False):
        settlement.invoice_mark_paid(invoice=invoice, user=machine.fixtures["admin"], reason="paid by bank transfer")
    machine.credit(invoice, int(invoice.amount_due_units))
    invoice.refresh_from_db()
    # then: the console's queue shows it, with all of the chain payment waiting
    money = ledger.invoice_money(invoice)
    due = invoice.amount_due_units
    assert (money.received, money.bought, money.flagged) == (2 * due, due, due)
    assert invoice.pk in {view.invoice.pk for view in selectors.flagged_payments()}
    assert ledger.order_money(machine.fresh()).breaches() == []
    # when: the operator refunds it, all of the chain payment goes back and the invoice stays paid
    with capture(execute=False):
        refund = unapplied.invoice_refund_unapplied(invoice=invoice, actor=machine.fixtures["admin"], now=machine.now)
    invoice.refresh_from_db()
    assert refund.amount_units == invoice.amount_due_units and refund.reason == Refund.Reason.UNUSED_PAYMENT
    assert invoice.status == Invoice.Status.SETTLED and not invoice.needs_operator
    assert ledger.order_money(machine.fresh()).breaches() == []


def test_the_transfer_late_to_confirm_when_the_invoice_was_marked_counts_toward_it(machine):
    # given: the customer's transfer seen on chain, not confirmed yet, and an admin marks the invoice paid for it
    machine.place_order("unpaid")
    invoice = machine.open_invoice(Invoice.Purpose.ORDER)
    due = int(invoice.amount_due_units)
    settlement.invoice_apply_chain_state(invoice=invoice, confirmed=0, pending=due, head=0, now=machine.now)
    invoice.refresh_from_db()
    with capture(execute=False):
        settlement.invoice_mark_paid(invoice=invoice, user=machine.fixtures["admin"], reason="transfer seen, slow")
    # when: it confirms, and the sweep runs
    machine.credit(invoice, due)
    with capture(execute=False):
        refunds.ledger_sweep(now=machine.now)
    invoice.refresh_from_db()
    # then: it paid the invoice once: nothing flagged, nothing owed back
    assert not invoice.needs_operator and not Refund.objects.filter(invoice=invoice).exists()
    money = ledger.invoice_money(invoice)
    assert (money.received, money.bought) == (due, due)
    assert ledger.order_money(machine.fresh()).breaches() == []
