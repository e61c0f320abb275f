"""Every coin that buys nothing has a path back (payments/unapplied.py), on the demo chain (anvil, demo token): a
partial payment on an order cancelled or expired, a full late payment whose lots were taken, a payment to a
replaced quote, a payment after a cancellation. Each is refunded by itself, or waits in the console's queue where
the operator refunds it or applies it to its order, and a refusal says why and changes nothing."""

import html
from datetime import timedelta

import pytest
from django.urls import reverse

from booking.models import Order, OrderStatus
from booking.services import orders_expire_stale_holds
from payments import invoices
from payments.demo import pay_invoice
from payments.models import Invoice, PaymentSettings, Refund
from payments.selectors import current_invoice
from payments.unapplied import unapplied_units
from tests.builders.orders import place
from tests.builders.payments import CHAIN_ID, after_expiry, confirm, scan

EURC = 1_000000  # one dEURC in base units

pytestmark = pytest.mark.django_db


def refunded_units(invoice: Invoice) -> int:
    return sum(int(refund.amount_units) for refund in Refund.objects.filter(invoice=invoice))


def act(client, invoice: Invoice, action: str) -> str:
    """The operator presses one of the flagged payment's buttons; the queue's page they land on, with its message."""
    url = reverse("console:flagged-payment", kwargs={"invoice_id": invoice.pk, "action": action})
    response = client.post(url)
    assert response.status_code == 302
    return html.unescape(client.get(response["Location"]).content.decode())


def expired_with(client, chain, booking_data, *, units: int | None, lots: str = "1") -> tuple[Order, Invoice]:
    """An order whose hold ran out; `units` paid after its quote expired (None: nothing)."""
    order, _token = place(client, booking_data(lots=lots))
    invoice = current_invoice(order)
    later = invoice.expires_at + timedelta(minutes=1)
    assert orders_expire_stale_holds(now=later) == 1
    if units:
        after_expiry(chain, invoice)
        pay_invoice(chain, invoice, units=units)
        confirm(chain, now=later + timedelta(minutes=5))
    order.refresh_from_db()
    invoice.refresh_from_db()
    return order, invoice


# --- refunded by itself ---------------------------------------------------------------------------------------------


def test_a_partial_payment_on_an_order_the_customer_cancels_is_refunded_and_so_is_what_comes_after(
    client, chain, booking_data, django_capture_on_commit_callbacks, mailoutbox
):
    # given 1,000.00 of 3,150.00 paid
    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    assert int(invoice.amount_due_units) == 3150 * EURC
    pay_invoice(chain, invoice, units=1000 * EURC)
    confirm(chain)

    # when the customer cancels the unpaid order
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token}))

    # then the 1,000.00 go back: a refund asks for an address, nothing waits silently
    order.refresh_from_db()
    invoice.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED
    refund = order.refunds.get()
    assert (refund.reason, int(refund.amount_units)) == (Refund.Reason.UNUSED_PAYMENT, 1000 * EURC)
    assert refund.status == Refund.Status.AWAITING_ADDRESS
    assert [message for message in mailoutbox if "give your address" in message.subject]
    assert not invoice.needs_operator

    # and the rest, sent anyway after the cancellation, is refunded too: never the same coin twice
    pay_invoice(chain, invoice, units=2150 * EURC)
    with django_capture_on_commit_callbacks(execute=True):
        confirm(chain)
    scan()  # scanned again: nothing opens twice
    invoice.refresh_from_db()
    assert sorted(int(r.amount_units) for r in order.refunds.all()) == [1000 * EURC, 2150 * EURC]
    assert refunded_units(invoice) == int(invoice.amount_confirmed_units) == 3150 * EURC
    assert not invoice.needs_operator and not order.fiscal_invoices.exists()  # never a sale


# --- waiting for an operator ----------------------------------------------------------------------------------------


def test_a_partial_payment_on_an_expired_order_waits_and_the_operator_refunds_it(
    client, chain, booking_data, operator, django_capture_on_commit_callbacks
):
    # given 1,000.00 paid, then the hold runs out
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice, units=1000 * EURC)
    confirm(chain)
    with django_capture_on_commit_callbacks(execute=True):
        orders_expire_stale_holds(now=invoice.expires_at + timedelta(minutes=1))
    invoice.refresh_from_db()
    assert invoice.needs_operator, "a partial payment on an expired order is kept in silence"
    client.force_login(operator)
    queue = html.unescape(client.get(reverse("console:queue")).content.decode())
    assert f'id="flagged-{invoice.pk}"' in queue and "Partial payment" in queue and "1000.00 of 3150.00" in queue

    # when the operator tries to apply it: refused, nothing changes
    page = act(client, invoice, "apply")
    assert "Only 1000.00 of the 3150.00 dEURC asked for were received" in page
    order.refresh_from_db()
    invoice.refresh_from_db()
    assert order.status == OrderStatus.EXPIRED and invoice.needs_operator and not order.refunds.exists()

    # when they refund it
    with django_capture_on_commit_callbacks(execute=True):
        page = act(client, invoice, "refund")

    # then a refund of the 1,000.00 opens, and the payment leaves the flagged queue for the refunds queue
    refund = order.refunds.get()
    assert (refund.reason, int(refund.amount_units)) == (Refund.Reason.UNUSED_PAYMENT, 1000 * EURC)
    assert "a refund of 1000.00 dEURC is opened" in page
    assert f'id="flagged-{invoice.pk}"' not in page and f'id="refund-{refund.pk}"' in page
    assert order.events.filter(reason="flagged payment refunded by an operator", actor=operator).exists()

    # and the rest, sent late, never settles the order: it waits again, for what was not refunded only
    after_expiry(chain, invoice, minutes=10)
    pay_invoice(chain, invoice, units=2150 * EURC)
    confirm(chain, now=invoice.expires_at + timedelta(minutes=15))
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert order.status == OrderStatus.EXPIRED and invoice.status != Invoice.Status.SETTLED
    assert invoice.needs_operator and unapplied_units(invoice) == 2150 * EURC
    # 3,150.00 received in all, but 1,000.00 of it went back: what is held cannot pay for the order
    assert "Only 2150.00 of the 3150.00 dEURC asked for were received" in act(client, invoice, "apply")
    act(client, invoice, "refund")
    invoice.refresh_from_db()
    assert refunded_units(invoice) == int(invoice.amount_confirmed_units) == 3150 * EURC


def test_a_full_late_payment_whose_lots_were_taken_cannot_be_applied_and_is_refunded(
    client, chain, booking_data, operator
):
    order, _token = place(client, booking_data(lots="6"))
    invoice = current_invoice(order)
    later = invoice.expires_at + timedelta(minutes=1)
    orders_expire_stale_holds(now=later)
    place(client, booking_data(lots="6", contact_email="quick@example.org"))  # someone else takes them
    after_expiry(chain, invoice)
    pay_invoice(chain, invoice)
    confirm(chain, now=later + timedelta(minutes=5))
    invoice.refresh_from_db()
    assert invoice.needs_operator and invoice.status == Invoice.Status.EXPIRED
    client.force_login(operator)

    page = act(client, invoice, "apply")

    assert "The lots of this order were taken after it expired: refund the payment instead." in page
    order.refresh_from_db()
    invoice.refresh_from_db()
    assert order.status == OrderStatus.EXPIRED and invoice.status == Invoice.Status.EXPIRED and invoice.needs_operator
    assert not order.allocations.filter(released_at__isnull=True).exists()

    act(client, invoice, "refund")
    refund = order.refunds.get()
    assert refund.amount_units == invoice.amount_due_units and refund.reason == Refund.Reason.UNUSED_PAYMENT
    invoice.refresh_from_db()
    assert not invoice.needs_operator and unapplied_units(invoice) == 0
    assert "refund" in act(client, invoice, "refund")  # pressed twice: refused, nothing more opens
    assert order.refunds.count() == 1


def test_a_full_late_payment_held_for_its_rate_is_applied_by_the_operator_while_its_lots_are_free(
    client, chain, booking_data, operator
):
    settings = PaymentSettings.current()
    settings.late_rate_tolerance_percent = 0  # every late payment waits for an operator
    settings.save()
    order, invoice = expired_with(client, chain, booking_data, units=3150 * EURC)
    assert invoice.needs_operator and order.status == OrderStatus.EXPIRED
    client.force_login(operator)

    page = act(client, invoice, "apply")

    assert "the payment is applied to the order" in page
    order.refresh_from_db()
    invoice.refresh_from_db()
    assert order.status == OrderStatus.PAID and order.allocations.filter(released_at__isnull=True).count() == 1
    assert invoice.status == Invoice.Status.SETTLED and not invoice.needs_operator
    assert invoice.fiscal_invoice.number  # the sale took place: its invoice is numbered
    assert not order.refunds.exists()
    assert f'id="flagged-{invoice.pk}"' not in page


def test_a_payment_to_a_replaced_quote_is_applied_to_the_order_still_waiting_and_replaces_its_quote(
    client, chain, booking_data, operator
):
    order, _token = place(client, booking_data(lots="1"))
    replaced = current_invoice(order)
    current = invoices.invoice_change_asset(order=order, asset_key=f"{CHAIN_ID}:ETH")
    pay_invoice(chain, replaced)  # the first quote's address, as the wallet had prepared it
    confirm(chain)
    replaced.refresh_from_db()
    assert replaced.needs_operator and replaced.status == Invoice.Status.INVALID
    client.force_login(operator)
    queue = html.unescape(client.get(reverse("console:queue")).content.decode())
    assert "Paid to a replaced quote" in queue

    act(client, replaced, "apply")

    order.refresh_from_db()
    replaced.refresh_from_db()
    current.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert replaced.status == Invoice.Status.SETTLED and not replaced.needs_operator
    assert current.status == Invoice.Status.INVALID  # the quote it replaced no longer asks for a payment


def test_a_payment_to_a_replaced_quote_of_an_order_paid_otherwise_is_refused_then_refunded(
    client, chain, booking_data, operator
):
    order, _token = place(client, booking_data(lots="1"))
    replaced = current_invoice(order)
    current = invoices.invoice_change_asset(order=order, asset_key=f"{CHAIN_ID}:dUSDT")
    pay_invoice(chain, current)
    pay_invoice(chain, replaced)
    confirm(chain)
    order.refresh_from_db()
    replaced.refresh_from_db()
    assert order.status == OrderStatus.PAID and replaced.needs_operator
    client.force_login(operator)

    assert "This order is paid already: refund this payment instead." in act(client, replaced, "apply")
    act(client, replaced, "refund")

    refund = order.refunds.get()
    assert (refund.invoice, int(refund.amount_units), refund.asset_symbol) == (replaced, 3150 * EURC, "dEURC")


# --- who may act, and bad input ---------------------------------------------------------------------------------


def test_only_operators_may_refund_or_apply_a_flagged_payment(client, chain, booking_data, django_user_model):
    order, invoice = expired_with(client, chain, booking_data, units=1000 * EURC)
    assert invoice.needs_operator
    staff = django_user_model.objects.create_user("sam", password="a-long-staff-password", is_staff=True)
    url = reverse("console:flagged-payment", kwargs={"invoice_id": invoice.pk, "action": "refund"})

    anonymous = client.post(url)
    client.force_login(staff)  # staff, without the "operate orders" permission
    not_operator = client.post(url)

    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert not_operator.status_code == 403
    assert not order.refunds.exists()
    invoice.refresh_from_db()
    assert invoice.needs_operator


def test_bad_requests_to_a_flagged_payment_are_answered_without_a_change(client, chain, booking_data, operator):
    order, invoice = expired_with(client, chain, booking_data, units=1000 * EURC)
    client.force_login(operator)

    unknown_action = client.post(
        reverse("console:flagged-payment", kwargs={"invoice_id": invoice.pk, "action": "mark-paid"})
    )
    missing_invoice = client.post(
        reverse("console:flagged-payment", kwargs={"invoice_id": invoice.pk + 999, "action": "refund"})
    )
    read_only = client.get(reverse("console:flagged-payment", kwargs={"invoice_id": invoice.pk, "action": "refund"}))

    assert (unknown_action.status_code, missing_invoice.status_code, read_only.status_code) == (404, 404, 405)
    assert not order.refunds.exists()


def test_an_order_still_waiting_for_its_payment_is_not_refunded_from_the_queue(client, chain, booking_data, operator):
    """Flagged while its order still waits (a transfer not confirmed in time): refunding it would leave the order
    waiting for money already gone back; the operator cancels the order instead, and the refund follows."""
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice, units=1000 * EURC)
    confirm(chain)
    Invoice.objects.filter(pk=invoice.pk).update(needs_operator=True)
    client.force_login(operator)

    page = act(client, invoice, "refund")

    assert "The order still waits for this payment: cancel the order first" in page
    assert not order.refunds.exists()


def test_the_console_speaks_french_to_a_french_operator(client, chain, booking_data, operator):
    _order, invoice = expired_with(client, chain, booking_data, units=1000 * EURC)
    client.force_login(operator)
    client.cookies["django_language"] = "fr"

    queue = html.unescape(client.get(reverse("console:queue")).content.decode())
    page = act(client, invoice, "apply")

    assert "Rembourser" in queue and "Appliquer à la commande" in queue and "Paiement partiel" in queue
    assert "Seuls 1000.00 des 3150.00 dEURC demandés ont été reçus" in page


def test_lots_taken_between_the_check_and_the_settlement_undo_the_whole_apply(
    client, chain, booking_data, operator, monkeypatch
):
    """The read that says the lots are free comes before the locked re-allocation: when the re-allocation finds them
    taken after all, the apply is refused and its transaction undone (no settlement, no refund, no order event)."""
    from booking import selectors as booking_selectors

    settings = PaymentSettings.current()
    settings.late_rate_tolerance_percent = 0
    settings.save()
    order, invoice = expired_with(client, chain, booking_data, units=6 * 3150 * EURC, lots="6")
    place(client, booking_data(lots="6", contact_email="quick@example.org"))  # the lots go to someone else
    monkeypatch.setattr(booking_selectors, "lots_free_again", lambda **kwargs: True)  # the stale read
    events = order.events.count()
    client.force_login(operator)

    page = act(client, invoice, "apply")

    assert "The order could not take this payment: nothing was changed. Refund it instead." in page
    order.refresh_from_db()
    invoice.refresh_from_db()
    assert order.status == OrderStatus.EXPIRED and order.events.count() == events
    assert invoice.status == Invoice.Status.EXPIRED and invoice.needs_operator and not order.refunds.exists()
    assert not order.fiscal_invoices.exists()


def test_a_replaced_quote_is_not_applied_when_the_current_quote_was_paid_too(client, chain, booking_data, operator):
    order, _token = place(client, booking_data(lots="1"))
    replaced = current_invoice(order)
    current = invoices.invoice_change_asset(order=order, asset_key=f"{CHAIN_ID}:dUSDT")
    pay_invoice(chain, replaced)
    pay_invoice(chain, current, units=int(current.amount_due_units) // 2)
    confirm(chain)
    client.force_login(operator)

    page = act(client, replaced, "apply")

    assert "The order's current quote received a payment too: refund this one instead." in page
    order.refresh_from_db()
    assert order.status == OrderStatus.AWAITING_PAYMENT
