"""Reads of the payments app: what the order page shows of its invoice."""

import hashlib
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time
from decimal import Decimal

import segno
from django.core.cache import cache
from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncMonth
from django.utils import timezone

from booking.models import Order
from payments import config
from payments.chain import checksum
from payments.models import ChainCursor, Invoice, Refund, RefundPayment, Transfer
from payments.refunds import refund_uri


def format_units(units: int | Decimal, decimals: int) -> str:
    """Base units as a plain decimal string, exact, without trailing zeros beyond two places."""
    value = Decimal(int(units)).scaleb(-decimals)
    text = f"{value:f}"
    if "." in text:
        whole, fraction = text.split(".")
        fraction = fraction.rstrip("0").ljust(2, "0") if decimals >= 2 else fraction.rstrip("0")
        text = f"{whole}.{fraction}" if fraction else whole
    return text


def payment_uri(invoice: Invoice) -> str:
    """EIP-681 payment request for what is still to be sent (transfers being confirmed count).

    Token: `ethereum:<token>@<chain>/transfer?address=<to>&uint256=<units>`;
    native coin: `ethereum:<to>@<chain>?value=<wei>`.
    """
    to = checksum(invoice.deposit_address)
    units = int(invoice.amount_outstanding_units or invoice.amount_due_units)
    if invoice.asset_contract:
        return f"ethereum:{checksum(invoice.asset_contract)}@{invoice.chain_id}/transfer?address={to}&uint256={units}"
    return f"ethereum:{to}@{invoice.chain_id}?value={units}"


@dataclass
class PaymentView:
    invoice: Invoice
    chain: config.Chain | None
    address: str
    amount: str
    amount_missing: str
    amount_received: str
    amount_pending: str  # seen, being confirmed
    amount_outstanding: str  # still to send once what is being confirmed counts
    uri: str
    qr_svg: str
    seen_block: int | None
    confirmations: int
    confirmations_required: int
    check_delayed: bool
    transfers: list[Transfer]
    choices: list[config.Asset]
    # An expired quote still watched: the customer may still paste the hash of a payment sent in time.
    takes_tx_hint: bool = False


def qr_svg(uri: str) -> str:
    """The payment request as an SVG QR code. Drawn once per URI and kept in the shared cache: the order page's
    status block re-renders it on every poll."""
    key = "qr:" + hashlib.sha256(uri.encode()).hexdigest()
    return cache.get_or_set(
        key, lambda: segno.make(uri, error="m").svg_inline(scale=4, dark="#16202b"), timeout=24 * 3600
    )


def current_invoice(order: Order) -> Invoice | None:
    return (
        Invoice.objects.filter(order=order, purpose=Invoice.Purpose.ORDER)
        .exclude(status=Invoice.Status.INVALID)
        .order_by("-created_at")
        .first()
    )


def open_extension_invoice(order: Order) -> Invoice | None:
    return (
        Invoice.objects.filter(order=order, purpose=Invoice.Purpose.EXTENSION)
        .exclude(status__in=[Invoice.Status.INVALID])
        .order_by("-created_at")
        .first()
    )


def payment_view(order: Order, *, invoice: Invoice | None = None) -> PaymentView | None:
    invoice = invoice or current_invoice(order)
    if invoice is None:
        return None
    chain = config.chain(invoice.chain_id)
    transfers = list(invoice.transfers.exclude(status=Transfer.Status.REMOVED).order_by("block_number", "log_index"))
    seen = [t.block_number for t in transfers if t.status == Transfer.Status.SEEN and not t.wrong_asset]
    seen_block = min(seen) if seen else None
    required = chain.confirmations if chain else 0
    confirmations = 0
    if seen_block is not None and invoice.last_seen_head:
        confirmations = max(0, min(required, invoice.last_seen_head - seen_block + 1))
    cursor = ChainCursor.objects.filter(chain_id=invoice.chain_id).only("unavailable_since").first()
    uri = payment_uri(invoice)
    return PaymentView(
        invoice=invoice,
        chain=chain,
        address=checksum(invoice.deposit_address),
        amount=format_units(invoice.amount_due_units, invoice.asset_decimals),
        amount_missing=format_units(invoice.amount_missing_units, invoice.asset_decimals),
        amount_received=format_units(invoice.amount_confirmed_units, invoice.asset_decimals),
        amount_pending=format_units(invoice.amount_pending_units, invoice.asset_decimals),
        amount_outstanding=format_units(invoice.amount_outstanding_units, invoice.asset_decimals),
        uri=uri,
        qr_svg=qr_svg(uri),
        seen_block=seen_block,
        confirmations=confirmations,
        confirmations_required=required,
        check_delayed=bool(invoice.check_delayed_since or (cursor and cursor.unavailable_since)),
        transfers=transfers,
        choices=config.assets(),
        takes_tx_hint=invoice.status == Invoice.Status.EXPIRED and timezone.now() < invoice.monitor_until,
    )


@dataclass(frozen=True)
class MonthRevenue:
    month: date
    currency: str
    settled: Decimal  # the invoices paid that month, at their price
    invoices: int
    refunded: Decimal = Decimal("0.00")  # refunds paid that month, at their original payment's rate

    @property
    def net(self) -> Decimal:
        return self.settled - self.refunded


def revenue_by_month(*, since: date) -> list[MonthRevenue]:
    """What was paid per calendar month (UTC) from `since`'s month, in each invoice's price currency (the catalog's
    currency; an earlier one, if the operator changed it, keeps its own rows), less the refunds paid that month:
    what the refund transactions carried, valued at the rate of the payment they refund, to the cent. Newest
    first. Two queries."""
    first = datetime.combine(since.replace(day=1), time.min, tzinfo=UTC)
    rows = (
        Invoice.objects.filter(status=Invoice.Status.SETTLED, settled_at__gte=first)
        .annotate(month=TruncMonth("settled_at", tzinfo=UTC))
        .order_by()
        .values("month", "fiat_currency")
        .annotate(settled=Sum("fiat_amount"), invoices=Count("pk"))
        .order_by("-month", "fiat_currency")
    )
    months = {
        (row["month"].date(), row["fiat_currency"]): MonthRevenue(
            month=row["month"].date(), currency=row["fiat_currency"], settled=row["settled"], invoices=row["invoices"]
        )
        for row in rows
    }
    refunded = RefundPayment.objects.filter(
        status=RefundPayment.Status.CONFIRMED, confirmed_at__gte=first, refund__isnull=False
    ).values_list(
        "confirmed_at",
        "amount_units",
        "refund__asset_decimals",
        "refund__rate",
        "refund__invoice__fiat_currency",
    )
    for confirmed_at, units, decimals, rate, currency in refunded:
        month = confirmed_at.astimezone(UTC).date().replace(day=1)
        value = (Decimal(units).scaleb(-decimals) * rate).quantize(Decimal("0.01"))
        row = months.setdefault(
            (month, currency), MonthRevenue(month=month, currency=currency, settled=Decimal("0.00"), invoices=0)
        )
        months[(month, currency)] = replace(row, refunded=row.refunded + value)
    return sorted(months.values(), key=lambda row: (-row.month.toordinal(), row.currency))


# --- refunds (payments/refunds.py) ---------------------------------------------------------------------------------


@dataclass
class RefundView:
    refund: Refund
    chain: config.Chain | None
    amount: str
    amount_paid: str
    amount_left: str
    address: str  # checksummed, or "" while the customer has not given one
    uri: str  # EIP-681 for what is left to pay, "" without an address
    qr_svg: str
    payments: list[RefundPayment]


def refund_view(refund: Refund, *, with_qr: bool = False) -> RefundView:
    uri = refund_uri(refund) if refund.is_open else ""
    return RefundView(
        refund=refund,
        chain=config.chain(refund.chain_id),
        amount=format_units(refund.amount_units, refund.asset_decimals),
        amount_paid=format_units(refund.amount_paid_units, refund.asset_decimals),
        amount_left=format_units(refund.amount_left_units, refund.asset_decimals),
        address=checksum(refund.address) if refund.address else "",
        uri=uri,
        qr_svg=qr_svg(uri) if with_qr and uri else "",
        payments=list(refund.payments.all()),
    )


def order_refunds(order: Order) -> list[RefundView]:
    """An order's refunds for its page, oldest first, with the transactions that paid them."""
    return [refund_view(refund) for refund in Refund.objects.filter(order=order).prefetch_related("payments")]


def order_refunds_paid(order: Order) -> bool:
    """Whether the order has refunds and every one of them is paid (its page then says the money went back)."""
    statuses = set(Refund.objects.filter(order=order).values_list("status", flat=True))
    return statuses == {Refund.Status.PAID}


REFUNDS_QUEUE_SIZE = 100


def open_refunds() -> list[RefundView]:
    """The console's refunds queue: every refund not paid yet, oldest first, with its EIP-681 link and QR code.
    A fixed number of queries (refunds, their orders, their payments)."""
    refunds = (
        Refund.objects.exclude(status=Refund.Status.PAID)
        .select_related("order")
        .prefetch_related("payments")
        .order_by("created_at")[:REFUNDS_QUEUE_SIZE]
    )
    return [refund_view(refund, with_qr=True) for refund in refunds]


def watched_invoices(now: datetime) -> Q:
    """Open invoices, and any invoice still within its monitoring window: a late payment, a payment to a replaced
    quote, a payment after settlement are all recorded (by the scan and by the balance nets alike). A replaced quote
    that received nothing stops being watched when it would have expired: switching assets cannot grow the watch for
    days."""
    replaced_empty = Q(
        status=Invoice.Status.INVALID,
        needs_operator=False,
        amount_confirmed_units=0,
        amount_pending_units=0,
        expires_at__lte=now,
    )
    return Q(status__in=[Invoice.Status.NEW, Invoice.Status.PROCESSING]) | (Q(monitor_until__gt=now) & ~replaced_empty)
