"""Dust (payments/ledger.py, docs/operations.md "Dust"): money that bought nothing and is worth less than
PAYMENTS_DUST_THRESHOLD in its invoice's price currency is noted on its order and counted in the reports, but
neither flagged for an operator nor refunded: a stranger's one-unit transfers would otherwise fill the console's
queues and e-mail the customer a refund request for each. The rule still holds: dust is one of its parts."""

from decimal import Decimal

import pytest

from booking import services as booking_services
from booking.models import OrderEvent
from payments import ledger, refunds, selectors
from payments.models import Invoice, Refund
from tests.builders.orders import place
from tests.payments.money_life import capture

pytestmark = pytest.mark.django_db


def dust_notes(order) -> list[OrderEvent]:
    return list(OrderEvent.objects.filter(order=order, reason__startswith="payment below the dust threshold"))


def test_a_few_cents_to_a_cancelled_order_are_noted_not_refunded(machine):
    # given: an order cancelled unpaid
    machine.place_order("unpaid")
    invoice = machine.open_invoice(Invoice.Purpose.ORDER)
    machine.cancel("customer")
    # when: a stranger sends 0.50 EUR worth to its deposit address, and beat's sweep runs
    cents = refunds.units_for_fiat(invoice=invoice, fiat_amount=Decimal("0.50"))
    machine.credit(invoice, cents)
    with capture():
        repaired = refunds.ledger_sweep(now=machine.now)
    # then: no refund (no e-mail, nothing in the queue), a note on the order, a line in the reports
    assert not Refund.objects.filter(invoice=invoice).exists() and repaired == 0
    assert len(dust_notes(machine.order)) >= 1
    money = ledger.order_money(machine.fresh(), now=machine.now)
    assert money.breaches() == [] and money.dust == cents
    held = {line.currency: line for line in selectors.money_held_or_owed(now=machine.now)}
    assert Decimal("0.49") <= held["EUR"].dust <= Decimal("0.50")


def test_one_unit_to_a_replaced_quote_is_not_flagged(machine):
    machine.place_order("unpaid")
    machine.can_switch_asset = True
    machine.pay_the_replaced_quote("part")  # a real part: flagged
    replaced = Invoice.objects.get(order=machine.order, status=Invoice.Status.INVALID)
    assert replaced.needs_operator
    current = machine.open_invoice(Invoice.Purpose.ORDER)
    from payments import invoices as invoice_services

    invoice_services.invoice_change_asset(order=machine.fresh(), asset_key="31337:dEURC")
    second = Invoice.objects.get(pk=current.pk)
    assert second.status == Invoice.Status.INVALID
    # when: one unit reaches the second replaced quote
    machine.credit(second, 1)
    second.refresh_from_db()
    # then: noted, not flagged; the customer's real part payment is still in the queue
    assert not second.needs_operator and len(dust_notes(machine.order)) == 1
    shown = {view.invoice.pk for view in selectors.flagged_payments()}
    assert replaced.pk in shown and second.pk not in shown
    assert ledger.order_money(machine.fresh(), now=machine.now).breaches() == []


def test_a_threshold_of_zero_refunds_every_unit(machine, settings):
    settings.PAYMENTS_DUST_THRESHOLD = Decimal(0)
    machine.place_order("unpaid")
    invoice = machine.open_invoice(Invoice.Purpose.ORDER)
    machine.cancel("customer")
    machine.credit(invoice, 1)
    assert list(Refund.objects.filter(invoice=invoice).values_list("amount_units", flat=True)) == [1]


def test_dust_that_adds_up_past_the_threshold_is_refunded_whole(machine):
    machine.place_order("unpaid")
    invoice = machine.open_invoice(Invoice.Purpose.ORDER)
    machine.cancel("customer")
    machine.credit(invoice, 1)
    worth_a_euro = refunds.units_for_fiat(invoice=invoice, fiat_amount=Decimal("1.00")) + 1
    machine.credit(invoice, worth_a_euro)
    assert list(Refund.objects.filter(invoice=invoice).values_list("amount_units", flat=True)) == [worth_a_euro + 1]
    assert ledger.order_money(machine.fresh(), now=machine.now).breaches() == []


def test_one_base_unit_to_a_cancelled_order_opens_no_refund_on_anvil(client, chain, booking_data):
    """On the demo chain: an order cancelled unpaid, then one base unit of its token sent to its deposit address
    (still watched for its monitoring window). The scan used to open a refund of 1 unit, waiting in the operator's
    queue and e-mailing the contact (issue 32's red team); it is dust now, noted on the order."""
    from payments import scanner
    from payments.demo import pay_invoice
    from payments.selectors import current_invoice

    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    booking_services.order_cancel_by_customer(order=order)
    pay_invoice(chain, invoice, units=1)
    chain.mine(3)
    scanner.chain_scan(chain_id=31337)
    dust = list(Refund.objects.filter(order=order).values_list("amount_units", flat=True))
    assert dust == [], f"a stranger's 1-unit transfer opened refunds {dust}, shown in the operator's queue"
    assert len(dust_notes(order)) >= 1
