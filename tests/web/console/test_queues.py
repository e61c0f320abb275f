"""The console's two money queues (flagged payments, refunds to pay) filled by a stranger with dust: the real count
in the header, oldest first (refunds worth the dust threshold before dust), a page at a time with "N more". Found
by issue 32's red team: each queue was a 100-capped list, newest first for the flagged payments, and its header
counted what it showed, so 100 one-unit payments hid a customer's money from the operator."""

import html
from datetime import timedelta

import pytest
from django.urls import reverse

from booking.models import OrderStatus
from payments import selectors, unapplied
from payments.models import Invoice, Refund
from tests.builders.orders import place

pytestmark = pytest.mark.django_db


def _flagged_victim(client, booking_data):
    order, _token = place(client, booking_data(lots="1"))
    invoice = Invoice.objects.get(order=order)
    invoice.amount_confirmed_units = int(invoice.amount_due_units) // 3
    invoice.status = Invoice.Status.EXPIRED
    invoice.save()
    order.status = OrderStatus.EXPIRED
    order.save(update_fields=["status"])
    unapplied.invoice_flag(order=order, invoice=invoice, why="order expired with a partial payment")
    return order, invoice


def test_a_stranger_hides_a_flagged_payment_from_the_console_with_dust(client, booking_data):
    """the console's flagged payments are the newest 100 (payments/selectors.py FLAGGED_QUEUE_SIZE,
    `flagged_payments`), and its header counts what is shown. A stranger who pays one base unit to the replaced
    quotes (or expired orders) of 100 orders of their own pushes a real customer's flagged payment out of the
    queue: nothing on the page says it exists, so it is never refunded nor applied."""
    _order, victim = _flagged_victim(client, booking_data)
    for n in range(100):
        dust = Invoice.objects.get(pk=victim.pk)
        dust.pk = None
        dust.deposit_address = "0x" + f"{n + 1:040x}"
        dust.derivation_index = 100_000 + n
        dust.amount_confirmed_units = 1
        dust.created_at = victim.created_at + timedelta(minutes=n + 1)
        dust.save()
        Invoice.objects.filter(pk=dust.pk).update(created_at=victim.created_at + timedelta(minutes=n + 1))
    shown = [view.invoice.pk for view in selectors.flagged_payments()]
    assert victim.pk in shown, f"{len(shown)} flagged payments shown, the customer's 1,050.00 EUR is not among them"


def test_a_stranger_hides_a_refund_from_the_console_with_dust(client, booking_data):
    """the console's refunds queue is the oldest 100 refunds not paid (payments/selectors.py
    REFUNDS_QUEUE_SIZE, `open_refunds`). A stranger places orders, cancels them unpaid and sends one base unit to
    each one's deposit address (watched until its monitoring window ends): each opens a refund of 1 unit
    (`settlement.invoice_apply_chain_state`, order closed → `refund_unaccounted`) whose address they never give,
    so it is never paid. After 100 of them every later refund, a real customer's cancellation included, is missing
    from the queue the operator pays from."""
    order, victim_invoice = _flagged_victim(client, booking_data)
    for _n in range(100):
        Refund.objects.create(
            order=order,
            invoice=victim_invoice,
            reason=Refund.Reason.UNUSED_PAYMENT,
            chain_id=victim_invoice.chain_id,
            asset_symbol=victim_invoice.asset_symbol,
            asset_contract=victim_invoice.asset_contract,
            asset_decimals=victim_invoice.asset_decimals,
            amount_units=1,
            rate=victim_invoice.rate,
        )
    victim = Refund.objects.create(
        order=order,
        invoice=victim_invoice,
        reason=Refund.Reason.UNUSED_PAYMENT,
        chain_id=victim_invoice.chain_id,
        asset_symbol=victim_invoice.asset_symbol,
        asset_contract=victim_invoice.asset_contract,
        asset_decimals=victim_invoice.asset_decimals,
        amount_units=int(victim_invoice.amount_confirmed_units),
        rate=victim_invoice.rate,
    )
    shown = [view.refund.pk for view in selectors.open_refunds()]
    assert victim.pk in shown, f"{len(shown)} refunds shown, the customer's is not among them"


def _dust_refunds(order, invoice, count: int) -> None:
    for _n in range(count):
        Refund.objects.create(
            order=order,
            invoice=invoice,
            reason=Refund.Reason.UNUSED_PAYMENT,
            chain_id=invoice.chain_id,
            asset_symbol=invoice.asset_symbol,
            asset_contract=invoice.asset_contract,
            asset_decimals=invoice.asset_decimals,
            amount_units=1,
            rate=invoice.rate,
        )


def test_the_console_counts_every_flagged_payment_and_pages_through_them(client, booking_data, operator):
    # given: a customer's flagged payment, then 100 more flagged after it
    _order, victim = _flagged_victim(client, booking_data)
    for n in range(100):
        other = Invoice.objects.get(pk=victim.pk)
        other.pk = None
        other.deposit_address = "0x" + f"{n + 1:040x}"
        other.derivation_index = 100_000 + n
        other.save()
        Invoice.objects.filter(pk=other.pk).update(created_at=victim.created_at + timedelta(minutes=n + 1))
    newest = other
    client.force_login(operator)
    # when: the operator opens the console
    page = client.get(reverse("console:queue")).content.decode()
    # then: the header says 101, the oldest (the customer's) is on the first page, and "1 more" leads to the rest
    assert 'Flagged payments <span class="status">101</span>' in page
    assert f'id="flagged-{victim.pk}"' in page and f'id="flagged-{newest.pk}"' not in page
    assert "1–100 of 101, oldest first." in page and "?flagged_page=2#section-flagged" in page and "1 more" in page
    second = client.get(reverse("console:queue") + "?flagged_page=2").content.decode()
    assert f'id="flagged-{newest.pk}"' in second and f'id="flagged-{victim.pk}"' not in second


def test_the_refunds_queue_shows_its_real_size_and_dust_after_the_rest(client, booking_data, operator):
    # given: 120 refunds of one unit (dust, opened before the threshold existed), then a customer's refund
    order, invoice = _flagged_victim(client, booking_data)
    _dust_refunds(order, invoice, 120)
    victim = Refund.objects.create(
        order=order,
        invoice=invoice,
        reason=Refund.Reason.CANCELLATION,
        chain_id=invoice.chain_id,
        asset_symbol=invoice.asset_symbol,
        asset_contract=invoice.asset_contract,
        asset_decimals=invoice.asset_decimals,
        amount_units=int(invoice.amount_confirmed_units),
        rate=invoice.rate,
    )
    client.force_login(operator)
    page = client.get(reverse("console:queue")).content.decode()
    # then: all 121 are counted, the customer's comes first, and the 21 left are one link away
    assert 'Refunds to pay <span class="status">121</span>' in page
    first = page.index('class="refund" id="refund-')
    assert page[first:].startswith(f'class="refund" id="refund-{victim.pk}"')
    assert "21 more" in page and "?refunds_page=2#section-refunds" in page
    assert selectors.open_refunds(page=2).total == 121 and len(selectors.open_refunds(page=2)) == 21


def test_the_queues_speak_french(client, booking_data, operator):
    order, invoice = _flagged_victim(client, booking_data)
    _dust_refunds(order, invoice, 101)
    client.force_login(operator)
    client.cookies["django_language"] = "fr"
    page = html.unescape(client.get(reverse("console:queue")).content.decode())
    assert "1–100 sur 101, les plus anciens d’abord." in page and "1 de plus" in page
