"""Refunds, in BTCPay's pull-payment shape: a refund is opened when money is owed back (a paid order cancelled or
rejected, an overpayment, a payment after settlement, a provider fault, a payment that bought nothing), the
customer gives an address on the paid chain, and the operator pays it from their own wallet: the portal holds no
key. Only a transaction read on chain moves a refund towards paid (`payments/refund_proofs.py`).

Every amount is read from the ledger (payments/ledger.py, "The ledger rule" in docs/architecture.md), and fixed in
base units of the original payment's asset when the refund opens:
- a refund of the price (cancellation, rejection, provider fault), only on an invoice its order took: from a fiat
  amount (the cancellation rules' `Order.refund_due`, the fault's pro rata), at the invoice's rate, rounded down to
  the base unit, never more than is left of its price; all that is left gives back exactly the units left (the
  quote rounded the amount due up);
- a refund of money that bought nothing (an overpayment, a payment after settlement or to a closed order, a refused
  extension, a part payment): the ledger's remainder, in base units as they were received.
Computed from what was given, never from what is left after this run's own refunds: a reaction run twice, or the
sweep after it, opens nothing more.

    awaiting_address ──address given──▶ due ──part paid──▶ partly_paid ──rest paid──▶ paid
          ▲   (the address stays editable until paid; every address given stays a destination that pays it)

Locks: order, then invoice (`lock_invoice`), then the refund (booking/locks.py).
"""

import logging
from datetime import datetime, timedelta
from decimal import ROUND_FLOOR, Decimal

from django.db import IntegrityError, transaction
from django.db.models import Case, When
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from booking import services as booking
from booking.models import Order, OrderEvent, OrderStatus
from payments import enqueue, ledger
from payments.chain import checksum
from payments.eip681 import payment_request_uri
from payments.errors import PaymentError
from payments.invoices import lock_invoice
from payments.models import ChainCursor, Invoice, Refund, RefundAddress

logger = logging.getLogger(__name__)

_HEX_ADDRESS_CHARS = frozenset("0123456789abcdefABCDEF")


def units_for_fiat(*, invoice: Invoice, fiat_amount: Decimal) -> int:
    """`fiat_amount` in the invoice's asset at the invoice's own rate: rounded down, at most what it asked for."""
    if fiat_amount >= invoice.fiat_amount:
        return int(invoice.amount_due_units)
    units = (fiat_amount / invoice.rate).scaleb(invoice.asset_decimals).to_integral_value(rounding=ROUND_FLOOR)
    return max(0, min(int(units), int(invoice.amount_due_units)))


def refund_open(
    *,
    order: Order,
    invoice: Invoice,
    reason: str,
    amount_units: int,
    fiat_amount: Decimal | None = None,
    evidence: dict | None = None,
) -> Refund | None:
    """Open a refund of `amount_units` of `invoice`'s asset. Called inside the caller's transaction, order and
    invoice locked. Returns None when nothing is owed, or when this refund is already open (a reaction run twice);
    the customer is e-mailed for their address after the commit."""
    if amount_units <= 0:
        return None
    try:
        with transaction.atomic():
            refund = Refund.objects.create(
                order=order,
                invoice=invoice,
                reason=reason,
                chain_id=invoice.chain_id,
                asset_symbol=invoice.asset_symbol,
                asset_contract=invoice.asset_contract,
                asset_decimals=invoice.asset_decimals,
                amount_units=amount_units,
                fiat_amount=fiat_amount,
                fiat_currency=invoice.fiat_currency if fiat_amount is not None else "",
                rate=invoice.rate,
            )
    except IntegrityError:
        return None  # the unique (invoice, reason) constraint: opened already
    invoice_unflag_if_nothing_waits(order=order, invoice=invoice)
    booking.order_note(
        order=order,
        reason=f"refund opened ({reason}): the customer is asked for an address",
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence={
            **(evidence or {}),
            "refund": refund.pk,
            "invoice": invoice.pk,
            "amount_units": str(amount_units),
            "asset": invoice.asset_symbol,
            "chain_id": invoice.chain_id,
        },
    )
    enqueue.send_refund_requested(refund.pk)
    return refund


# Paid for and then refused or called off: what was paid goes back, by the operator's hand.
REFUND_REASON_BY_STATUS = {
    OrderStatus.CANCELLED: Refund.Reason.CANCELLATION,
    OrderStatus.REJECTED: Refund.Reason.REJECTION,
}


# The refunds that give back (part of) an invoice's price: the ledger's (payments/ledger.py).
PRICE_REFUND_REASONS = ledger.PRICE_REFUND_REASONS


def price_left_to_refund(invoice: Invoice) -> tuple[Decimal, int]:
    """What is left of `invoice`'s price once the refunds of its price opened so far are given: (fiat, units). An
    invoice its order did not take (a refused extension) has no price left to refund: it bought nothing."""
    money = ledger.invoice_money(invoice)
    if not money.is_taken:
        return Decimal(0), 0
    return max(money.bought_price, Decimal(0)), max(int(money.bought), 0)


def _price_share_units(*, invoice: Invoice, money: ledger.InvoiceMoney, fiat: Decimal) -> int:
    """`fiat` of what is left of the invoice's price, in its units: all the units left when it is all that is left
    (the quote rounded the amount due up), else at the invoice's rate rounded down."""
    if fiat >= money.bought_price:
        return max(int(money.bought), 0)
    return min(units_for_fiat(invoice=invoice, fiat_amount=fiat), max(int(money.bought), 0))


def invoice_unflag_if_nothing_waits(*, order: Order, invoice: Invoice, now: datetime | None = None) -> bool:
    """In the caller's transaction, order and invoice locked: a flagged invoice of which the ledger says nothing
    waits for an operator any more (it all went back, by a cancellation's refund or the sweep) leaves the console's
    queue, where neither of its actions could do anything. Returns whether the flag was cleared."""
    if not invoice.needs_operator or ledger.invoice_money(invoice, order=order, now=now).flagged > 0:
        return False
    invoice.needs_operator = False
    invoice.save(update_fields=["needs_operator"])
    booking.order_note(
        order=order,
        reason="flagged payment owed back in full: it no longer waits for an operator",
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence={"invoice": invoice.pk},
    )
    return True


def refund_unaccounted(
    *,
    order: Order,
    invoice: Invoice,
    reason: str = Refund.Reason.UNUSED_PAYMENT,
    evidence: dict | None = None,
    now: datetime | None = None,
) -> Refund | None:
    """Open a refund of the money `invoice` holds that bought nothing and is neither refunded nor owed back yet
    (the ledger's flagged and unaccounted remainder), in its units, as received. Order and invoice locked by the
    caller; the invoice as the caller holds it (a confirmed amount just read counts). Computed from what was
    given, so a second run opens nothing: the remainder is then 0."""
    money = ledger.invoice_money(invoice, order=order, now=now)
    left = int(money.flagged + money.unaccounted)
    if left <= 0:
        invoice_unflag_if_nothing_waits(order=order, invoice=invoice, now=now)
        if money.dust > 0:  # a refund of it would e-mail the customer and wait in the queue for a few cents
            from payments.unapplied import note_dust

            note_dust(order=order, invoice=invoice, units=int(money.dust), why=f"not refunded ({reason})")
        return None
    return refund_open(
        order=order,
        invoice=invoice,
        reason=reason,
        amount_units=left,
        evidence={**(evidence or {}), "received_units": str(money.received), "bought_units": str(money.bought)},
    )


def refunds_open_for_order(*, order_id: int) -> list[Refund]:
    """The refunds of an order that will not be served (cancelled or rejected), from its ledger:
    - each invoice its order took gives back its share of the price: for a customer's cancellation, the amount its
      rules gave and the customer was shown (`Order.refund_due`), over the booking's invoice first, then the
      extensions', each at most what is left of its price (a provider-fault refund given before counts);
      otherwise (rejected, cancelled by an operator) all that is left of it;
    - every other coin the order's invoices received and that bought nothing (a part payment, a payment to a
      replaced quote, an extension paid and not given) goes back as it came (`refund_unaccounted`).
    Computed from what was given: an invoice that has its refund of this reason counts for what it gave, so a
    second run opens nothing. The credit notes follow the refunds, in the same transaction (payments/fiscal.py)."""
    from payments import fiscal

    opened = []
    with transaction.atomic():
        order = Order.objects.filter(pk=order_id).first()
        if order is None or order.status not in REFUND_REASON_BY_STATUS:
            return []
        reason = REFUND_REASON_BY_STATUS[order.status]
        still_due = order.refund_due
        invoices = Invoice.objects.filter(order_id=order_id)
        for invoice in invoices.order_by(Case(When(purpose=Invoice.Purpose.ORDER, then=0), default=1), "pk"):
            order, invoice = lock_invoice(invoice)
            money = ledger.invoice_money(invoice, order=order)
            if money.is_taken:
                given = Refund.objects.filter(invoice=invoice, reason=reason).first()
                if given is not None:  # its share was fixed when it opened
                    if still_due is not None:
                        still_due -= min(still_due, given.fiat_amount or Decimal(0))
                    invoice_unflag_if_nothing_waits(order=order, invoice=invoice)
                    continue
                left = max(money.bought_price, Decimal(0))
                fiat = left if still_due is None else min(still_due, left)
                if still_due is not None:
                    still_due -= fiat
                refund = refund_open(
                    order=order,
                    invoice=invoice,
                    reason=reason,
                    amount_units=_price_share_units(invoice=invoice, money=money, fiat=fiat),
                    fiat_amount=fiat,
                    evidence={"order_status": order.status},
                )
            else:
                refund = refund_unaccounted(order=order, invoice=invoice, evidence={"order_status": order.status})
            if refund is not None:
                opened.append(refund)
        fiscal.fiscal_credit_notes_for_refund(order_id=order_id)
    return opened


def ledger_sweep(*, now: datetime | None = None, batch_size: int = 200) -> int:
    """Beat's repair of money reactions lost after their commit (a worker stopped between the transition and its
    reaction), from the ledger; safe to run twice at once (each repair locks order and invoice and re-reads them):
    - a cancelled or rejected order with no refund of that reason yet, one of whose taken invoices has some of its
      price left to give back (the ledger's word: an order whose whole price went back already, for a provider
      fault, has nothing left to repair and is not selected again run after run): its refunds open
      (`refunds_open_for_order`, which opens nothing more when they are there);
    - an invoice that holds money that bought nothing, neither owed back nor flagged, and can no longer be
      completed: refunded when its order takes no more payments (cancelled, rejected, ended), else flagged for an
      operator (an expired order whose late payment was partial, a replaced quote).
    Returns how many orders and invoices it repaired."""
    from django.db.models import Exists, F, OuterRef, Q

    now = now or timezone.now()
    repaired = 0
    closed = list(REFUND_REASON_BY_STATUS)
    price_left = ledger.invoices_with_left(now=now).filter(
        order=OuterRef("pk"), taken=True, refunds_of_price__lt=F("amount_due_units")
    )
    lost_reactions = (
        Order.objects.filter(status__in=closed)
        .filter(Q(refund_due__isnull=True) | Q(refund_due__gt=0))
        .filter(Exists(price_left))
        .exclude(Exists(Refund.objects.filter(order=OuterRef("pk"), reason__in=list(REFUND_REASON_BY_STATUS.values()))))
        .order_by("updated_at")
        .values_list("pk", flat=True)[:batch_size]
    )
    for order_id in list(lost_reactions):
        repaired += bool(refunds_open_for_order(order_id=order_id))

    # What is left must be worth the dust threshold at least (payments/ledger.py): dust is noted, not repaired, and
    # a stranger's one-unit transfers must not fill the batch run after run.
    candidates = (
        ledger.invoices_with_left(now=now)
        .filter(amount_confirmed_units__gt=0, needs_operator=False, can_complete=False)
        .filter(
            Q(left_units__gt=0, left_units__gte=F("dust_units"))
            # Marked paid, and paid on chain on top of what the chain showed then (payments/ledger.py).
            | Q(
                taken=True,
                marked=True,
                marked_chain_units__isnull=False,
                refunds_beyond_price__lt=F("amount_confirmed_units") - F("marked_chain_units"),
                refunds_beyond_price__lte=F("amount_confirmed_units") - F("marked_chain_units") - F("dust_units"),
            )
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:batch_size]
    )
    # Flags the ledger says nothing waits behind (all of it owed back by a reaction that did not clear them).
    stale_flags = (
        ledger.invoices_with_left(now=now)
        .filter(needs_operator=True, left_units__lte=0)
        .order_by("pk")
        .values_list("pk", flat=True)[:batch_size]
    )
    for invoice_id in list(stale_flags):
        with transaction.atomic():
            order, invoice = lock_invoice(Invoice.objects.get(pk=invoice_id))
            repaired += invoice_unflag_if_nothing_waits(order=order, invoice=invoice, now=now)

    for invoice_id in list(candidates):
        with transaction.atomic():
            order, invoice = lock_invoice(Invoice.objects.get(pk=invoice_id))
            money = ledger.invoice_money(invoice, order=order, now=now)
            if money.unaccounted <= 0:
                continue
            evidence = {"invoice": invoice.pk, "unaccounted_units": str(money.unaccounted), "sweep": True}
            if order.status in ledger.CLOSED_STATUSES:
                repaired += refund_unaccounted(order=order, invoice=invoice, evidence=evidence, now=now) is not None
                continue
            invoice.needs_operator = True
            invoice.save(update_fields=["needs_operator"])
            booking.order_note(
                order=order,
                reason="payment that bought nothing waits for an operator",
                actor_kind=OrderEvent.Actor.SYSTEM,
                evidence=evidence,
            )
            repaired += 1
    return repaired


def lost_time_share(*, order: Order, lost: timedelta, lots: int) -> Decimal:
    """What `lost` hours of `lots` of the order's lots are worth, pro rata of what bought its whole window (the
    invoices its order took: the booking and the extensions given; a refused extension bought nothing), to the
    cent below: the price of the time the provider failed to give."""
    paid = ledger.order_money(order).window_price
    window = (order.ends_at - order.starts_at).total_seconds()
    if window <= 0 or paid <= 0:
        return Decimal(0)
    share = paid * Decimal(min(lost.total_seconds(), window)) / Decimal(window) * lots / max(1, order.lot_count)
    return share.quantize(Decimal("0.01"), rounding=ROUND_FLOOR)


def refund_for_lost_time(*, order: Order, lost: timedelta, lots: int) -> Refund:
    """A provider fault credited as money: the pro-rata share of the time lost (`lost_time_share`) is refunded on the
    order's invoice, in its asset at its rate, at most what is left of its price, and a credit note corrects the
    fiscal invoice by the same amount. In the caller's transaction. PaymentError when there is nothing to refund
    on, or one is open already."""
    from payments import fiscal

    invoice = Invoice.objects.filter(order=order, purpose=Invoice.Purpose.ORDER, status=Invoice.Status.SETTLED).first()
    if invoice is None or not ledger.invoice_is_taken(invoice):
        raise PaymentError(
            _("This order has no settled invoice to refund on: credit the lost time as a longer window.")
        )
    order, invoice = lock_invoice(invoice)
    if Refund.objects.filter(invoice=invoice, reason=Refund.Reason.PROVIDER_FAULT).exists():
        raise PaymentError(
            _("A refund for a provider fault was given on this order already: credit this time as a longer window.")
        )
    money = ledger.invoice_money(invoice, order=order)
    fiat = min(lost_time_share(order=order, lost=lost, lots=lots), max(money.bought_price, Decimal(0)))
    hours = round(lost.total_seconds() / 3600, 2)
    refund = refund_open(
        order=order,
        invoice=invoice,
        reason=Refund.Reason.PROVIDER_FAULT,
        amount_units=_price_share_units(invoice=invoice, money=money, fiat=fiat),
        fiat_amount=fiat,
        evidence={"hours_lost": hours, "lots": lots},
    )
    if refund is None:
        raise PaymentError(_("The time lost is worth nothing to refund: credit it as a longer window."))
    booking.order_record_fault_refund(order=order, amount=fiat)
    fiscal_invoice = getattr(invoice, "fiscal_invoice", None)
    if fiscal_invoice is not None:
        with translation.override(fiscal_invoice.language):
            reason = _("provider fault: %(hours)s hours lost on %(lots)s lot(s), refunded pro rata") % {
                "hours": hours,
                "lots": lots,
            }
        fiscal.fiscal_credit_note_issue(invoice=fiscal_invoice, amount=fiat, reason=reason)
    return refund


def refund_address_problem(*, refund: Refund, text: str) -> str | None:
    """Why `text` cannot be this refund's address, in words for the customer; None when it can."""
    value = text.strip()
    if not (len(value) == 42 and value[:2] == "0x" and set(value[2:]) <= _HEX_ADDRESS_CHARS):
        return _("Enter an address on the network you paid on: 0x followed by 40 hexadecimal characters.")
    if value != checksum(value):
        return _(
            "This address does not pass its checksum (EIP-55): copy it again from your wallet, with its capital "
            "letters exactly as shown. A mistyped address would lose the refund."
        )
    lowered = value.lower()
    if int(lowered, 16) == 0:
        return _("This is the zero address: nothing sent there can be spent. Enter your own address.")
    if lowered == refund.asset_contract or Invoice.objects.filter(deposit_address=lowered).exists():
        return _("This address belongs to the payment system, not to you: enter an address of your own wallet.")
    return None


# Addresses one refund may be given over its life: each is watched by the scan until the refund is paid.
MAX_REFUND_ADDRESSES = 5


def refund_set_address(*, refund: Refund, address: str, now: datetime | None = None) -> Refund:
    """The customer gives (or changes) the address to refund to: on the paid chain, for the same asset, in its
    checksummed form. Editable until the refund is paid, at most MAX_REFUND_ADDRESSES different ones. Every
    address given is kept (`RefundAddress`): a transfer to any of them pays the refund, so a change made while the
    operator's payout to the previous one is on its way does not make the operator pay twice. The contact is
    e-mailed when the address changes."""
    now = now or timezone.now()
    problem = refund_address_problem(refund=refund, text=address)
    if problem:
        raise PaymentError(problem, field="address")
    lowered = address.strip().lower()
    with transaction.atomic():
        order, _invoice = lock_invoice(refund.invoice)
        refund = Refund.objects.select_for_update().get(pk=refund.pk)
        if refund.status == Refund.Status.PAID:
            raise PaymentError(_("This refund is already paid: its address can no longer change."), field="address")
        if refund.address == lowered:
            return refund
        previous = refund.address
        proven = ChainCursor.objects.filter(chain_id=refund.chain_id).values_list("confirmed_block", flat=True).first()
        if previous:  # given before the history was kept: it stays a destination too
            RefundAddress.objects.get_or_create(refund=refund, address=previous, defaults={"given_at": now})
        known = set(refund.addresses.values_list("address", flat=True))
        if lowered not in known and len(known) >= MAX_REFUND_ADDRESSES:
            raise PaymentError(
                _("This refund has had too many addresses: write to us to change it again."), field="address"
            )
        # The scan watches each address from the chain's proven block when it was given (refund_proofs.
        # refunds_detect); the refund's own watch goes on, so a transfer to a previous address is still seen.
        RefundAddress.objects.get_or_create(
            refund=refund, address=lowered, defaults={"given_at": now, "watch_from_block": proven}
        )
        refund.address, refund.address_set_at = lowered, now
        if not previous:
            refund.scanned_to_block = proven
        if refund.status == Refund.Status.AWAITING_ADDRESS:
            refund.status = Refund.Status.DUE
        refund.save(update_fields=["address", "address_set_at", "scanned_to_block", "status"])
        booking.order_note(
            order=order,
            reason="refund address changed" if previous else "refund address given",
            actor_kind=OrderEvent.Actor.CUSTOMER,
            evidence={"refund": refund.pk, "address": lowered, "previous": previous},
        )
        enqueue.send_refund_address_changed(refund.pk, lowered, previous)
    return refund


def refund_destinations(refund: Refund) -> list[tuple[str, int | None]]:
    """Every address the refund was given, with the proven block from which the scan watches it (None: from the
    refund's own watch); a transfer to any of them pays the refund. The current address comes first."""
    history = dict(refund.addresses.values_list("address", "watch_from_block"))
    current = [(refund.address, history.pop(refund.address, None))] if refund.address else []
    return current + sorted(history.items())


def refund_uri(refund: Refund) -> str:
    """EIP-681 request (payments/eip681.py) for what is left to pay. Empty while there is no address."""
    if not refund.address:
        return ""
    return payment_request_uri(
        chain_id=refund.chain_id, to=refund.address, units=refund.amount_left_units, token=refund.asset_contract
    )
