"""How an invoice is paid, and what its order does about it. `invoice_apply_chain_state` moves an invoice and its
order to what the scanner read (seen, confirmed, gone again in a reorganisation, not confirmed in time, paid
after settlement), and applies the late-payment policy: paid after its quote expired, a first payment settles by
itself only while its lots are free and the rate moved less than the operator's tolerance, else it waits for an
operator with the figures. An admin's `invoice_mark_paid` is the other way in; both settle through one `_settle`
(an extension, a first payment, a late one, or a flag when the order can no longer take it) and send the
"payment received" e-mail after the commit. Last, the reaction to the order's transitions: a settled invoice of
an order cancelled or rejected opens its refunds (payments/refunds.py), as does an overpayment.

Locks: order, then invoice (`lock_invoice`), then allocation rows through booking (booking/locks.py).
"""

from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from booking import selectors as booking_selectors
from booking import services as booking
from booking.models import Order, OrderEvent, OrderStatus
from booking.rules import BookingError
from payments import config, enqueue, fiscal, ledger, refunds, unapplied
from payments.errors import PaymentError
from payments.invoices import lock_invoice
from payments.models import Invoice, PaymentSettings, Refund, Transfer
from payments.quotes import quote


def invoice_apply_chain_state(*, invoice: Invoice, confirmed: int, pending: int, head: int, now: datetime) -> bool:
    """Move the invoice and its order to what the chain shows (`confirmed` and `pending` base units in its asset).
    Returns True when the invoice settled now."""
    with transaction.atomic():
        order, invoice = lock_invoice(invoice)
        was, confirmed_before = invoice.status, int(invoice.amount_confirmed_units)
        invoice.amount_confirmed_units, invoice.amount_pending_units = confirmed, pending
        due = int(invoice.amount_due_units)
        evidence = {"invoice": invoice.pk, "confirmed_units": str(confirmed), "head": head}
        if invoice.status == Invoice.Status.SETTLED:
            # Paid again after settlement: recorded; only what exceeds the amount due is owed back. An invoice an
            # admin marked paid counts the transfer the chain showed then (late to confirm) when it confirms; what
            # confirms beyond it came on top of the amount due paid by another route (the ledger's word): it
            # waits for an operator, who knows whether the customer paid twice. It never moves the order.
            on_top_of_mark = (
                invoice.marked
                and invoice.marked_chain_units is not None
                and confirmed > int(invoice.marked_chain_units)
            )
            if confirmed > confirmed_before and on_top_of_mark and order.status not in ledger.CLOSED_STATUSES:
                if unapplied.unapplied_units(invoice, order=order):
                    unapplied.invoice_flag(
                        order=order, invoice=invoice, why="paid on chain after an admin marked it paid by another route"
                    )
            elif confirmed > confirmed_before and (confirmed > due or on_top_of_mark):
                invoice.paid_over = True
                # What the ledger says this invoice holds and bought nothing: beyond its price when its order took
                # it, all of it when it did not (a refused extension), less what went back already.
                refund = refunds.refund_unaccounted(
                    order=order, invoice=invoice, reason=Refund.Reason.LATE_PAYMENT, evidence=evidence, now=now
                )
                booking.order_note(
                    order=order,
                    reason="payment after settlement: refund owed",
                    actor_kind=OrderEvent.Actor.SYSTEM,
                    evidence={
                        **evidence,
                        "received_after_settlement_units": str(confirmed - confirmed_before),
                        "refund_owed_units": str(refund.amount_units if refund else 0),
                    },
                )
            elif confirmed > confirmed_before and invoice.marked:
                booking.order_note(
                    order=order,
                    reason="transfer confirmed for an invoice marked paid: counted toward it",
                    actor_kind=OrderEvent.Actor.SYSTEM,
                    evidence={**evidence, "received_after_settlement_units": str(confirmed - confirmed_before)},
                )
        elif invoice.status == Invoice.Status.INVALID:
            closed = order.status in ledger.CLOSED_STATUSES  # it all goes back by itself (below)
            if not closed and (pending or unapplied.unapplied_units(invoice, order=order)):
                # Paid to a replaced quote (or again after an operator refunded it): refund or apply by hand.
                unapplied.invoice_flag(order=order, invoice=invoice, why="payment to a replaced or closed quote")
        elif confirmed >= due:
            invoice.paid_over = confirmed > due
            invoice.paid_partial = False
            invoice.paid_late = _paid_at(invoice, now) > invoice.expires_at
            held = invoice.paid_late and order.status not in ledger.CLOSED_STATUSES  # closed: it all goes back
            if held and (figures := _late_payment_held(order=order, invoice=invoice, now=now)):
                # Not settled by itself: an operator decides (mark paid, or refund), with the figures.
                invoice.status, invoice.needs_operator = Invoice.Status.EXPIRED, True
                booking.order_note(
                    order=order,
                    reason=f"late payment waits for an operator: {figures['why']}",
                    actor_kind=OrderEvent.Actor.SYSTEM,
                    evidence={**evidence, **figures},
                )
                invoice.save()
                return False
            taken = _settle(
                order=order,
                invoice=invoice,
                actor_kind=OrderEvent.Actor.SYSTEM,
                reason="payment confirmed on chain",
                evidence=evidence,
                now=now,
            )
            if taken and invoice.paid_over:  # not taken: the whole payment is owed back already
                refunds.refund_unaccounted(
                    order=order, invoice=invoice, reason=Refund.Reason.OVERPAYMENT, evidence=evidence, now=now
                )
            return True
        elif pending and now >= invoice.monitor_until:
            # BTCPay's "not confirmed in time": seen, never final within the watch. An operator looks at it.
            invoice.status, invoice.needs_operator = Invoice.Status.INVALID, True
            invoice.paid_partial = 0 < confirmed < due
            booking.order_note(
                order=order,
                reason="payment not confirmed in time: invoice invalid, kept for an operator",
                actor_kind=OrderEvent.Actor.SYSTEM,
                evidence={**evidence, "pending_units": str(pending)},
            )
        elif pending:
            invoice.status = Invoice.Status.PROCESSING
            invoice.paid_partial = 0 < confirmed < due
        else:
            invoice.paid_partial = 0 < confirmed < due
            invoice.status = Invoice.Status.EXPIRED if now >= invoice.expires_at else Invoice.Status.NEW
        if (
            invoice.status != Invoice.Status.SETTLED
            and confirmed
            and order.status not in ledger.CLOSED_STATUSES
            and (
                order.status == OrderStatus.EXPIRED
                or (invoice.purpose == Invoice.Purpose.EXTENSION and invoice.status == Invoice.Status.EXPIRED)
            )
            and unapplied.unapplied_units(invoice, order=order)
        ):
            # Part of a payment for a hold that ran out: it buys nothing unless the rest comes (the late payment
            # then settles by the policy above); meanwhile it waits in the console's queue.
            unapplied.invoice_flag(order=order, invoice=invoice, why="partial payment after the hold expired")
        _follow_chain(order=order, invoice=invoice, was=was, evidence=evidence, now=now)
        if order.status in ledger.CLOSED_STATUSES and int(invoice.amount_confirmed_units) > confirmed_before:
            # Paid (in part, or to a replaced quote) for an order that takes no more payments: it goes back.
            refunds.refund_unaccounted(order=order, invoice=invoice, evidence=evidence, now=now)
        invoice.save()
    return False


def _paid_at(invoice: Invoice, now: datetime) -> datetime:
    """When the invoice was paid in full, by the chain's clock: the time of the block where its confirmed credits,
    taken in chain order, first reached the amount due (when a block's time is unknown, when the scanner first saw
    it); the latest of them when they never did. A stranger's dust confirmed after an on-time payment (address
    poisoning, coin forwarded by a contract) leaves the payment on time."""
    credits = sorted(
        (block_number, block_time or first_seen, int(amount))
        for block_number, block_time, first_seen, amount in invoice.transfers.filter(
            wrong_asset=False, status=Transfer.Status.CONFIRMED
        ).values_list("block_number", "block_time", "first_seen_at", "amount_units")
    )
    received = 0
    for _block, moment, amount in credits:
        received += amount
        if received >= int(invoice.amount_due_units):
            return moment
    return max((moment for _block, moment, _amount in credits), default=now)


def _late_payment_held(*, order: Order, invoice: Invoice, now: datetime) -> dict | None:
    """Why a late first payment must wait for an operator, with the figures; None when it may settle by itself: its
    lots are still free and the rate moved less than the operator's tolerance since the quote."""
    if invoice.purpose != Invoice.Purpose.ORDER:
        return None
    figures: dict = {"quoted_rate": str(invoice.rate), "quoted_at": invoice.created_at.isoformat()}
    asset = config.asset(invoice.chain_id, invoice.asset_symbol)
    try:
        current = (
            quote(asset=asset, fiat_amount=invoice.fiat_amount, fiat_currency=invoice.fiat_currency) if asset else None
        )
    except PaymentError:
        current = None
    if current is None:
        return {**figures, "why": "the current rate cannot be read"}
    moved = abs(current.rate - invoice.rate) / invoice.rate * 100
    tolerance = PaymentSettings.current().late_rate_tolerance_percent
    figures.update(
        current_rate=str(current.rate),
        rate_moved_percent=f"{moved:.2f}",
        tolerance_percent=str(tolerance),
        due_now_units=str(current.amount_due_units),
    )
    if moved >= tolerance:
        return {**figures, "why": f"the rate moved {moved:.2f}% since the quote (tolerance {tolerance}%)"}
    if order.status == OrderStatus.EXPIRED and not booking_selectors.lots_free_again(order=order, now=now):
        return {**figures, "why": "its lots were taken after the hold expired"}
    return None


def _follow_chain(*, order: Order, invoice: Invoice, was: str, evidence: dict, now: datetime) -> None:
    """Before settlement, the order follows what the chain shows: a transfer seen, or gone again (reorg)."""
    if invoice.purpose != Invoice.Purpose.ORDER:
        return
    if invoice.status == Invoice.Status.PROCESSING and order.status == OrderStatus.AWAITING_PAYMENT:
        booking.order_transition(
            order=order,
            to_status=OrderStatus.PAYMENT_PROCESSING,
            actor_kind=OrderEvent.Actor.SYSTEM,
            reason="transfer seen on chain",
            evidence=evidence,
            now=now,
        )
    elif (
        invoice.status in (Invoice.Status.NEW, Invoice.Status.EXPIRED, Invoice.Status.INVALID)
        and was == Invoice.Status.PROCESSING
        and order.status == OrderStatus.PAYMENT_PROCESSING
    ):
        # Back to waiting: its hold runs out as any unpaid order's would (booking's sweep expires it).
        booking.order_transition(
            order=order,
            to_status=OrderStatus.AWAITING_PAYMENT,
            actor_kind=OrderEvent.Actor.SYSTEM,
            reason=(
                "payment not confirmed in time"
                if invoice.status == Invoice.Status.INVALID
                else "transfer no longer on chain (reorganisation)"
            ),
            evidence=evidence,
            now=now,
        )


def _settle(
    *,
    order: Order,
    invoice: Invoice,
    actor_kind: str,
    reason: str,
    evidence: dict,
    now: datetime,
    actor: AbstractBaseUser | None = None,
) -> bool:
    """Settle a locked invoice and carry it to its order: the one way an invoice is paid, seen on chain by the
    scanner or marked by an admin. An extension moves the window's end; a first payment makes the order paid
    (what follows, such as auto-approval, reacts to that transition), or holds its lots again when it came after
    the hold expired. When the order cannot take the payment any more (cancelled meanwhile, lots taken), the
    invoice is flagged for an operator: a refund or a new date is owed. An order that will never be served
    (cancelled, rejected), or an extension that can no longer be given, owes back the whole payment received: a
    refund opens. Returns whether the order took the payment."""
    invoice.status, invoice.settled_at = Invoice.Status.SETTLED, now
    carried = True
    try:
        if invoice.purpose == Invoice.Purpose.EXTENSION:
            booking.order_extend(order=order, days=invoice.extension_days, evidence=evidence, price=invoice.fiat_amount)
        elif order.status in (OrderStatus.AWAITING_PAYMENT, OrderStatus.PAYMENT_PROCESSING):
            booking.order_transition(
                order=order,
                to_status=OrderStatus.PAID,
                actor_kind=actor_kind,
                actor=actor,
                reason=reason,
                evidence=evidence,
                now=now,
            )
        elif order.status == OrderStatus.EXPIRED:
            booking.order_reallocate_after_late_payment(order=order, evidence=evidence, now=now, actor=actor)
        else:
            raise BookingError(_("This order can no longer take a payment."))
    except BookingError as exc:
        carried = False
        invoice.needs_operator = True
        booking.order_note(
            order=order,
            reason=f"payment kept for an operator ({reason}): {exc.message}",
            actor_kind=actor_kind,
            actor=actor,
            evidence=evidence,
        )
        # Money that buys nothing goes back: an order that will not be served, or an extension that can no longer
        # be given (its lots were taken meanwhile, the window ended). What goes back is what the ledger says the
        # invoice holds and bought nothing (a part of it may have gone back already).
        if order.status in refunds.REFUND_REASON_BY_STATUS or invoice.purpose == Invoice.Purpose.EXTENSION:
            refunds.refund_unaccounted(
                order=order,
                invoice=invoice,
                reason=(
                    Refund.Reason.LATE_PAYMENT
                    if order.status in refunds.REFUND_REASON_BY_STATUS
                    else Refund.Reason.EXTENSION_REFUSED
                ),
                evidence=evidence,
                now=now,
            )
            invoice.needs_operator = False  # it goes back by itself: nothing of it waits for an operator
    if carried:  # nothing of it waits for an operator any more (a late or replaced payment applied)
        invoice.needs_operator = False
    invoice.save()
    if carried:  # the sale took place: its fiscal invoice is numbered in this transaction (payments/fiscal.py)
        fiscal.fiscal_invoice_issue(order=order, invoice=invoice, now=now)
    invoice_id = invoice.pk
    _send_payment_received(invoice_id)  # queued once the transaction commits
    return carried


def _send_payment_received(invoice_id: int) -> None:
    enqueue.send_payment_received(invoice_id)


# --- admin review --------------------------------------------------------------------------------------------


@transaction.atomic
def invoice_mark_paid(*, invoice: Invoice, user: AbstractBaseUser, reason: str, now: datetime | None = None) -> None:
    """An admin settles an invoice by hand (e.g. paid by another route). The reason is required and audited."""
    now = now or timezone.now()
    reason = reason.strip()
    if not reason:
        raise PaymentError(_("Give the reason for marking this invoice paid."), field="reason")
    order, invoice = lock_invoice(invoice)
    if invoice.status == Invoice.Status.SETTLED:
        raise PaymentError(_("This invoice is already paid."))
    invoice.marked, invoice.marked_reason, invoice.marked_by = True, reason, user
    # The transfer the mark may be for (seen, late to confirm): counted toward it when it confirms; beyond it, what
    # confirms came on top of the payment made elsewhere (payments/ledger.py).
    invoice.marked_chain_units = int(invoice.amount_confirmed_units) + int(invoice.amount_pending_units)
    _settle(
        order=order,
        invoice=invoice,
        actor_kind=OrderEvent.Actor.ADMIN,
        actor=user,
        reason=f"marked paid: {reason}",
        evidence={"invoice": invoice.pk, "marked_by": user.get_username(), "reason": reason},
        now=now,
    )


def settle_for_operator(*, order: Order, invoice: Invoice, actor: AbstractBaseUser, now: datetime) -> None:
    """An operator applies a flagged payment to its order (payments/unapplied.py), order and invoice locked: it
    settles as a payment in time would, what exceeds the price is refunded, and the flag is cleared. When the order
    does not take it after all, PaymentError, and the caller's transaction undoes everything."""
    evidence = {"invoice": invoice.pk, "applied_by": actor.get_username()}
    taken = _settle(
        order=order,
        invoice=invoice,
        actor_kind=OrderEvent.Actor.OPERATOR,
        actor=actor,
        reason="flagged payment applied to the order by an operator",
        evidence=evidence,
        now=now,
    )
    if not taken:
        raise PaymentError(_("The order could not take this payment: nothing was changed. Refund it instead."))
    if int(invoice.amount_confirmed_units) > int(invoice.amount_due_units):
        invoice.paid_over = True
        invoice.save(update_fields=["paid_over"])
        # What the ledger says it holds beyond its price, less what went back already.
        refunds.refund_unaccounted(order=order, invoice=invoice, reason=Refund.Reason.OVERPAYMENT, evidence=evidence)


# --- reactions to the order's transitions (connected in payments/apps.py) ------------------------------------


def on_order_status_changed(*, order_id: int, to_status: str, **kwargs) -> None:
    """Paid for and then refused or called off: what its rules give back is a refund, in the refunds queue."""
    if to_status in refunds.REFUND_REASON_BY_STATUS:
        refunds.refunds_open_for_order(order_id=order_id)
