"""What catches a payment the cursor's scan did not credit, and what must not be flagged: a transaction hash the
customer pastes (read on chain by the portal itself), a transfer confirming after an admin marked its invoice
paid, and "I've paid" pressed again and again."""

import html

from django.urls import reverse

from booking.models import Order, OrderStatus
from payments import scanner, settlement
from payments.demo import pay_invoice
from payments.models import Invoice, Transfer
from payments.selectors import current_invoice
from tests.booking.test_pages import place

CHAIN_ID = 31337


def scan() -> scanner.ScanResult:
    return scanner.chain_scan(chain_id=CHAIN_ID)


def order_page(client, order: Order, token: str) -> str:
    url = reverse("booking:order", kwargs={"public_id": order.public_id, "token": token})
    return html.unescape(client.get(url).content.decode())


# --- a transfer confirming after an admin marked the invoice paid ----------------------------------------------


def test_a_marked_invoice_counts_its_own_transfer_and_flags_no_refund(client, chain, booking_data, admin_user):
    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice)  # sent, not yet confirmed: the admin marks it paid meanwhile
    settlement.invoice_mark_paid(invoice=invoice, user=admin_user, reason="customer showed the transfer")

    chain.mine(3)
    scan()

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and invoice.marked
    assert invoice.amount_confirmed_units == invoice.amount_due_units
    assert not invoice.paid_over and not invoice.needs_operator
    reasons = list(order.events.values_list("reason", flat=True))
    assert "payment after settlement: refund owed" not in reasons
    assert "transfer confirmed for an invoice marked paid: counted toward it" in reasons
    assert "an operator will refund the difference" not in order_page(client, order, token)


def test_a_marked_invoice_paid_beyond_its_due_flags_only_the_excess(client, chain, booking_data, admin_user):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    settlement.invoice_mark_paid(invoice=invoice, user=admin_user, reason="paid by bank wire")
    pay_invoice(chain, invoice, units=int(invoice.amount_due_units) + 7_000000)

    chain.mine(3)
    scan()

    invoice.refresh_from_db()
    assert invoice.paid_over
    event = order.events.get(reason="payment after settlement: refund owed")
    assert event.evidence["refund_owed_units"] == "7000000"
