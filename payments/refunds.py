"""Refunds, in BTCPay's pull-payment shape: a refund is opened when money is owed back (a paid order cancelled or
rejected, an overpayment, a payment after settlement, a provider fault), the customer gives an address on the paid
chain, and the operator pays it from their own wallet: the portal holds no key. Only a transaction read on chain
moves a refund towards paid (`payments/refund_proofs.py`).

The amount is fixed in base units of the original payment's asset when the refund opens:
- from a fiat amount (the cancellation rules' `Order.refund_due`), at the original invoice's rate, rounded down to
  the base unit (never more than the rules give), and never more than the invoice's amount due; a refund of the
  whole price gives back exactly the amount due (the quote rounded that one up);
- from base units (an overpayment), as they were received.

    awaiting_address ──address given──▶ due ──part paid──▶ partly_paid ──rest paid──▶ paid
          ▲   (the address stays editable until paid)

Locks: order, then invoice (`lock_invoice`), then the refund (conventions.md #4).
"""

import logging
from datetime import datetime, timedelta
from decimal import ROUND_FLOOR, Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from booking import services as booking
from booking.models import Order, OrderEvent, OrderStatus
from payments.chain import checksum
from payments.errors import PaymentError
from payments.invoices import lock_invoice
from payments.models import ChainCursor, Invoice, Refund

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
    from payments.tasks import send_refund_requested

    send_refund_requested.delay_on_commit(refund.pk)
    return refund


# Paid for and then refused or called off: what was paid goes back, by the operator's hand.
REFUND_REASON_BY_STATUS = {
    OrderStatus.CANCELLED: Refund.Reason.CANCELLATION,
    OrderStatus.REJECTED: Refund.Reason.REJECTION,
}


def refunds_open_for_order(*, order_id: int) -> list[Refund]:
    """The refunds of an order that will not be served, one per settled invoice: for a customer's cancellation, the
    amount its rules gave (`Order.refund_due`, nothing when they give nothing); otherwise (rejected, cancelled by an
    operator) what the invoice asked for."""
    opened = []
    with transaction.atomic():
        order = Order.objects.filter(pk=order_id).first()
        if order is None or order.status not in REFUND_REASON_BY_STATUS or order.refund_due == 0:
            return []
        reason = REFUND_REASON_BY_STATUS[order.status]
        for invoice in Invoice.objects.filter(order_id=order_id, status=Invoice.Status.SETTLED).order_by("pk"):
            order, invoice = lock_invoice(invoice)
            if invoice.purpose == Invoice.Purpose.ORDER and order.refund_due is not None:
                fiat = min(order.refund_due, invoice.fiat_amount)
                units = units_for_fiat(invoice=invoice, fiat_amount=fiat)
            else:
                fiat, units = invoice.fiat_amount, int(invoice.amount_due_units)
            refund = refund_open(
                order=order,
                invoice=invoice,
                reason=reason,
                amount_units=units,
                fiat_amount=fiat,
                evidence={"order_status": order.status},
            )
            if refund is not None:
                opened.append(refund)
    return opened


def lost_time_share(*, order: Order, lost: timedelta, lots: int) -> Decimal:
    """What `lost` hours of `lots` of the order's lots are worth, pro rata of what its settled invoices asked for
    its whole window (extensions included), to the cent below: the price of the time the provider failed to
    give."""
    paid = sum(
        Invoice.objects.filter(order=order, status=Invoice.Status.SETTLED).values_list("fiat_amount", flat=True),
        Decimal(0),
    )
    window = (order.ends_at - order.starts_at).total_seconds()
    if window <= 0 or paid <= 0:
        return Decimal(0)
    share = paid * Decimal(min(lost.total_seconds(), window)) / Decimal(window) * lots / max(1, order.lot_count)
    return share.quantize(Decimal("0.01"), rounding=ROUND_FLOOR)


def refund_for_lost_time(*, order: Order, lost: timedelta, lots: int, now: datetime | None = None) -> Refund:
    """A provider fault credited as money: the pro-rata share of the time lost (`lost_time_share`) is refunded on the
    order's invoice, in its asset at its rate, and a credit note corrects the fiscal invoice by the same amount.
    In the caller's transaction. PaymentError when there is nothing to refund on, or one is open already."""
    from payments import fiscal

    now = now or timezone.now()
    invoice = Invoice.objects.filter(order=order, purpose=Invoice.Purpose.ORDER, status=Invoice.Status.SETTLED).first()
    if invoice is None:
        raise PaymentError(
            _("This order has no settled invoice to refund on: credit the lost time as a longer window.")
        )
    order, invoice = lock_invoice(invoice)
    if Refund.objects.filter(invoice=invoice, reason=Refund.Reason.PROVIDER_FAULT).exists():
        raise PaymentError(
            _("A refund for a provider fault was given on this order already: credit this time as a longer window.")
        )
    fiat = min(lost_time_share(order=order, lost=lost, lots=lots), invoice.fiat_amount)
    hours = round(lost.total_seconds() / 3600, 2)
    refund = refund_open(
        order=order,
        invoice=invoice,
        reason=Refund.Reason.PROVIDER_FAULT,
        amount_units=units_for_fiat(invoice=invoice, fiat_amount=fiat),
        fiat_amount=fiat,
        evidence={"hours_lost": hours, "lots": lots},
    )
    if refund is None:
        raise PaymentError(_("The time lost is worth nothing to refund: credit it as a longer window."))
    fiscal_invoice = getattr(invoice, "fiscal_invoice", None)
    if fiscal_invoice is not None:
        with translation.override(fiscal_invoice.language):
            reason = _("provider fault: %(hours)s hours lost on %(lots)s lot(s), refunded pro rata") % {
                "hours": hours,
                "lots": lots,
            }
        fiscal.fiscal_credit_note_issue(invoice=fiscal_invoice, amount=fiat, reason=reason, now=now)
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


def refund_set_address(*, refund: Refund, address: str, now: datetime | None = None) -> Refund:
    """The customer gives (or changes) the address to refund to: on the paid chain, for the same asset, in its
    checksummed form. Editable until the refund is paid."""
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
        refund.address, refund.address_set_at = lowered, now
        # The scan watches a token refund's address from the chain's proven block (refund_proofs.refunds_detect).
        refund.scanned_to_block = (
            ChainCursor.objects.filter(chain_id=refund.chain_id).values_list("confirmed_block", flat=True).first()
        )
        if refund.status == Refund.Status.AWAITING_ADDRESS:
            refund.status = Refund.Status.DUE
        refund.save(update_fields=["address", "address_set_at", "scanned_to_block", "status"])
        booking.order_note(
            order=order,
            reason="refund address changed" if previous else "refund address given",
            actor_kind=OrderEvent.Actor.CUSTOMER,
            evidence={"refund": refund.pk, "address": lowered, "previous": previous},
        )
    return refund


def refund_uri(refund: Refund) -> str:
    """EIP-681 request for what is left to pay: `ethereum:<token>@<chain>/transfer?address=<to>&uint256=<units>`,
    native coin `ethereum:<to>@<chain>?value=<wei>`. Empty while there is no address."""
    if not refund.address:
        return ""
    to, units = checksum(refund.address), refund.amount_left_units
    if refund.asset_contract:
        return f"ethereum:{checksum(refund.asset_contract)}@{refund.chain_id}/transfer?address={to}&uint256={units}"
    return f"ethereum:{to}@{refund.chain_id}?value={units}"
