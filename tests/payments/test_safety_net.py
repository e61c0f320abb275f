"""What catches a payment the cursor's scan did not credit, and what must not be flagged: a transaction hash the
customer pastes (read on chain by the portal itself), a transfer confirming after an admin marked its invoice
paid, and "I've paid" pressed again and again."""

import html

import pytest
from django.urls import reverse

from booking.models import Order
from payments import scanner, settlement
from payments.demo import pay_invoice
from payments.models import Invoice
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


# --- "I've paid" pressed again and again --------------------------------------------------------------------------


def test_pressing_ive_paid_again_starts_no_second_chain_of_checks(client, chain, booking_data, monkeypatch):
    from payments import tasks

    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    queued = []
    # The broker's side only: what would be queued is counted (the lock it passes through is the real cache).
    monkeypatch.setattr(tasks.check_invoice, "apply_async", lambda args, **kwargs: queued.append(args))
    paid_url = reverse("booking:order-paid", kwargs={"public_id": order.public_id, "token": token})

    for _press in range(5):
        assert client.post(paid_url, {"tx_hint": ""}).status_code == 302

    assert queued == [[invoice.pk]]
    invoice.refresh_from_db()
    assert invoice.customer_paid_at is not None and invoice.check_requested_at is not None

    # The check runs (eagerly here: its last attempt) and frees the invoice for a later press.
    monkeypatch.undo()
    tasks.check_invoice.apply(args=[invoice.pk])
    monkeypatch.setattr(tasks.check_invoice, "apply_async", lambda args, **kwargs: queued.append(args))
    client.post(paid_url, {"tx_hint": ""})
    assert queued == [[invoice.pk], [invoice.pk]]


def test_a_check_that_keeps_retrying_holds_the_invoice_until_its_last_attempt(chain, client, booking_data, monkeypatch):
    from celery.exceptions import Retry
    from django.core.cache import cache

    from payments import invoices, tasks

    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    invoices.invoice_customer_paid(invoice=invoice)  # its eager check ran to the end: the key is free
    key = invoices.check_pending_key(invoice.pk)
    assert cache.get(key) is None
    task = tasks.check_invoice
    retries = []

    def retry(**kwargs):  # what the worker would schedule; its queueing is not what this test is about
        retries.append(kwargs.get("countdown"))
        return Retry()

    monkeypatch.setattr(task, "retry", retry)

    # An attempt with retries left and nothing paid yet: it retries, and holds the invoice meanwhile.
    task.push_request(retries=3, is_eager=False)
    try:
        with pytest.raises(Retry):
            task.run(invoice.pk)
    finally:
        task.pop_request()
    assert retries == [tasks.CHECK_DELAYS[3]] and cache.get(key) is True
    queued = []
    monkeypatch.setattr(task, "apply_async", lambda args, **kwargs: queued.append(args))
    assert invoices.invoice_request_check(invoice_id=invoice.pk) and queued == []  # a press meanwhile queues none

    # Its last attempt frees it.
    task.push_request(retries=task.max_retries, is_eager=False)
    try:
        assert task.run(invoice.pk) == Invoice.Status.NEW
    finally:
        task.pop_request()
    assert cache.get(key) is None and len(retries) == 1
