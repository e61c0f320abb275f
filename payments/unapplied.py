"""Money that buys nothing and waits for an operator: what an invoice received that its order cannot take now, and
the operator's two ways out of the console's queue.

A coin received either buys time, goes back, or waits in front of an operator (docs/architecture.md, "The ledger
rule"). Money reaching an order that takes no more payments (cancelled, rejected, ended) goes back by itself
(payments/refunds.py, `refund_unaccounted`). What is left here is money whose order might still be served, so a
person decides:

- a part payment on an order whose hold expired (flagged as the hold expires, or as the part arrives after), a
  payment to a replaced quote, a full late payment whose lots were taken or whose rate moved: the invoice is flagged
  (`needs_operator`) and waits in the console's queue with two actions:
- **refund** it (`invoice_refund_unapplied`): all it received that is not refunded or owed back yet, in its asset
  on its chain (the customer is asked for an address; paid and proven on chain as every refund), and the invoice
  is closed (`invalid`), so that it never settles afterwards: a payment reaching it later waits again, for what
  is new;
- **apply** it to its order (`invoice_apply_to_order`), only when the order can still take it: paid in full, the
  order not cancelled, rejected, ended or paid by another invoice, its lots still free. It settles as a payment in
  time would. A refusal changes nothing and says why.

Locks: order, then invoice (`lock_invoice`), as booking/locks.py orders them.
"""

from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from booking import selectors as booking_selectors
from booking import services as booking
from booking.models import Order, OrderEvent, OrderStatus
from booking.rules import BookingError
from payments import ledger, refunds
from payments.errors import PaymentError
from payments.invoices import lock_invoice
from payments.models import Invoice, Refund

# Orders still waiting for their payment: their open invoice is not "unapplied" yet, it may still be completed.
WAITING_STATUSES = (OrderStatus.AWAITING_PAYMENT, OrderStatus.PAYMENT_PROCESSING)


def unapplied_units(invoice: Invoice, *, order: Order | None = None) -> int:
    """What `invoice` received that bought nothing and is not refunded or owed back yet: the ledger's remainder
    (payments/ledger.py), whatever it is called there (flagged, pending, unaccounted)."""
    money = ledger.invoice_money(invoice, order=order)
    return max(0, int(money.received - money.bought - money.refunds))


def invoice_close_and_refund(*, order: Order, invoice: Invoice, reason: str, evidence: dict) -> Refund | None:
    """In the caller's transaction, order and invoice locked: what the invoice received and bought nothing is
    refunded (the ledger's remainder, `refunds.refund_unaccounted`), and the invoice is closed: it never settles
    afterwards, and a payment reaching it later waits again for what is new. Returns the refund, None when nothing
    was left."""
    refund = refunds.refund_unaccounted(order=order, invoice=invoice, reason=reason, evidence=evidence)
    if invoice.status != Invoice.Status.SETTLED:
        invoice.status = Invoice.Status.INVALID
    invoice.needs_operator = False
    invoice.save(update_fields=["status", "needs_operator"])
    return refund


def on_order_expired(*, order_id: int, to_status: str, **kwargs) -> None:
    """The reaction to an order's transition (payments/apps.py): an order whose hold expired with part of its
    payment received flags the invoice for an operator, who may still apply a late payment to it, or refund it."""
    if to_status != OrderStatus.EXPIRED:
        return
    with transaction.atomic():
        for invoice in Invoice.objects.filter(order_id=order_id, amount_confirmed_units__gt=0).exclude(
            status=Invoice.Status.SETTLED
        ):
            order, invoice = lock_invoice(invoice)
            if invoice.status == Invoice.Status.SETTLED or order.status != to_status:
                continue  # settled or moved on meanwhile: its own path took it
            if unapplied_units(invoice, order=order):
                invoice_flag(order=order, invoice=invoice, why="order expired with a partial payment")


def invoice_flag(*, order: Order, invoice: Invoice, why: str) -> None:
    """In the caller's transaction: the invoice waits for an operator in the console's queue."""
    if invoice.needs_operator:
        return
    left = unapplied_units(invoice, order=order)
    if ledger.is_dust(invoice, left):
        note_dust(order=order, invoice=invoice, units=left, why=why)
        return
    invoice.needs_operator = True
    invoice.save(update_fields=["needs_operator"])
    booking.order_note(
        order=order,
        reason=f"payment kept for an operator: {why}",
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence={"invoice": invoice.pk, "received_units": str(ledger.invoice_received_units(invoice))},
    )


def note_dust(*, order: Order, invoice: Invoice, units: int, why: str) -> None:
    """In the caller's transaction: money that bought nothing and is worth less than the dust threshold is noted on
    its order (and counted in the console's reports), neither flagged nor refunded (docs/operations.md, "Dust")."""
    booking.order_note(
        order=order,
        reason=f"payment below the dust threshold kept, not flagged nor refunded: {why}",
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence={
            "invoice": invoice.pk,
            "dust_units": str(units),
            "value": f"{ledger.units_fiat(invoice, units):.2f} {invoice.fiat_currency}",
            "threshold": f"{ledger.dust_threshold()} {invoice.fiat_currency}",
        },
    )


# --- the operator's two actions -------------------------------------------------------------------------------------


def _open_on_waiting_order(order: Order, invoice: Invoice) -> bool:
    return invoice.is_open and invoice.purpose == Invoice.Purpose.ORDER and order.status in WAITING_STATUSES


@transaction.atomic
def invoice_refund_unapplied(*, invoice: Invoice, actor: AbstractBaseUser, now: datetime | None = None) -> Refund:
    """The operator refunds a flagged payment: all it received that is not refunded yet, in its asset on its chain
    (the customer is asked for an address), and the invoice is closed, so that it never settles afterwards."""
    order, invoice = lock_invoice(invoice)
    if not invoice.needs_operator:
        raise PaymentError(_("This payment no longer waits for an operator: nothing was changed."))
    if _open_on_waiting_order(order, invoice):
        raise PaymentError(
            _("The order still waits for this payment: cancel the order first (its payment is then refunded).")
        )
    if unapplied_units(invoice, order=order) <= 0:
        raise PaymentError(_("Nothing received on this payment is left to refund: it is owed back already."))
    refund = invoice_close_and_refund(
        order=order,
        invoice=invoice,
        reason=Refund.Reason.UNUSED_PAYMENT,
        evidence={"invoice": invoice.pk, "by": actor.get_username()},
    )
    booking.order_note(
        order=order,
        reason="flagged payment refunded by an operator",
        actor_kind=OrderEvent.Actor.OPERATOR,
        actor=actor,
        evidence={"invoice": invoice.pk, "refund": refund.pk, "amount_units": str(refund.amount_units)},
    )
    return refund


def apply_problem(*, order: Order, invoice: Invoice, now: datetime | None = None) -> str | None:
    """Why a flagged payment cannot buy its order's time now, in words for the operator; None when it can (a read:
    the settlement decides, locked)."""
    now = now or timezone.now()
    if order.status in ledger.CLOSED_STATUSES:
        return _("This order was cancelled, rejected or ended: it can no longer take a payment. Refund it instead.")
    # What it holds, not what it ever received: a part refunded already cannot pay for the order again.
    received, due = unapplied_units(invoice, order=order), int(invoice.amount_due_units)
    if received < due:
        from payments.selectors import format_units

        return _(
            "Only %(received)s of the %(due)s %(asset)s asked for were received: refund it, or wait for the rest."
        ) % {
            "received": format_units(received, invoice.asset_decimals),
            "due": format_units(due, invoice.asset_decimals),
            "asset": invoice.asset_symbol,
        }
    if ledger.invoice_is_taken(invoice):
        return _("This payment already bought its time.")
    if invoice.purpose == Invoice.Purpose.EXTENSION:
        try:
            booking.extension_check(order=order, days=invoice.extension_days)
        except BookingError as exc:
            return _("The extension can no longer be given (%(why)s): refund the payment instead.") % {
                "why": exc.message
            }
        return None
    if order.status == OrderStatus.EXPIRED:
        if not booking_selectors.lots_free_again(order=order, now=now):
            return _("The lots of this order were taken after it expired: refund the payment instead.")
        return None
    if order.status in WAITING_STATUSES:
        others = Invoice.objects.filter(order=order, purpose=Invoice.Purpose.ORDER).exclude(pk=invoice.pk)
        if others.filter(Q(status=Invoice.Status.SETTLED) | Q(amount_confirmed_units__gt=0)).exists():
            return _("The order's current quote received a payment too: refund this one instead.")
        return None
    return _("This order is paid already: refund this payment instead.")


@transaction.atomic
def invoice_apply_to_order(*, invoice: Invoice, actor: AbstractBaseUser, now: datetime | None = None) -> None:
    """The operator applies a flagged payment to its order, as if it had come in time: the order is paid (its lots
    held again after an expired hold), or the extension given. Refused, with nothing changed, when the order can
    no longer take it (`apply_problem`)."""
    from payments.settlement import settle_for_operator

    now = now or timezone.now()
    order, invoice = lock_invoice(invoice)
    if not invoice.needs_operator:
        raise PaymentError(_("This payment no longer waits for an operator: nothing was changed."))
    problem = apply_problem(order=order, invoice=invoice, now=now)
    if problem:
        raise PaymentError(problem)
    if invoice.purpose == Invoice.Purpose.ORDER and order.status in WAITING_STATUSES:
        # Paid to a replaced quote while the order still waits: the current quote is replaced by the paid one.
        Invoice.objects.filter(order=order, purpose=Invoice.Purpose.ORDER).exclude(pk=invoice.pk).exclude(
            status=Invoice.Status.INVALID
        ).update(status=Invoice.Status.INVALID)
    settle_for_operator(order=order, invoice=invoice, actor=actor, now=now)
