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
from payments.eip681 import payment_request_uri
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
    """EIP-681 payment request (payments/eip681.py) for what is still to be sent (transfers being confirmed count)."""
    return payment_request_uri(
        chain_id=invoice.chain_id,
        to=invoice.deposit_address,
        units=invoice.amount_outstanding_units or invoice.amount_due_units,
        token=invoice.asset_contract,
    )


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
    settled: Decimal  # sales: the price of the invoices whose order took the payment that month (time given)
    invoices: int
    refunded: Decimal = Decimal("0.00")  # the price given back that month (cancellation, rejection, provider fault)

    @property
    def net(self) -> Decimal:
        return self.settled - self.refunded


def _fiat(units, decimals: int, rate: Decimal) -> Decimal:
    return (Decimal(int(units)).scaleb(-decimals) * rate).quantize(Decimal("0.01"))


def revenue_by_month(*, since: date) -> list[MonthRevenue]:
    """Revenue per calendar month (UTC) from `since`'s month, in each invoice's price currency (an earlier
    currency, if the operator changed it, keeps its own rows): the price of the time given less the price refunded,
    as the ledger counts them (payments/ledger.py, docs/architecture.md "The ledger rule").

    - A sale is an invoice whose order took the payment (its fiscal invoice was numbered as it settled), in the
      month it settled, at its price. A refused extension, a payment to a cancelled, expired or replaced order is
      settled or held but bought nothing: not a sale.
    - The price refunded is what the refunds of a sale's price give back (cancellation, rejection, provider fault),
      in the month the refund was opened (its credit note's), at the amount fixed then. Refunds of money that was
      never revenue (an overpayment, a payment after settlement or to a closed order, a refused extension) are not
      subtracted: that money is in `money_held_or_owed`, until it has gone back.

    Newest first. Two queries."""
    from payments.ledger import PRICE_REFUND_REASONS

    first = datetime.combine(since.replace(day=1), time.min, tzinfo=UTC)
    rows = (
        Invoice.objects.filter(status=Invoice.Status.SETTLED, settled_at__gte=first, fiscal_invoice__isnull=False)
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
    price_refunds = Refund.objects.filter(
        reason__in=PRICE_REFUND_REASONS, created_at__gte=first, invoice__fiscal_invoice__isnull=False
    ).values_list("created_at", "fiat_amount", "amount_units", "asset_decimals", "rate", "invoice__fiat_currency")
    for created_at, fiat_amount, units, decimals, rate, currency in price_refunds:
        month = created_at.astimezone(UTC).date().replace(day=1)
        value = fiat_amount if fiat_amount is not None else _fiat(units, decimals, rate)
        row = months.setdefault(
            (month, currency), MonthRevenue(month=month, currency=currency, settled=Decimal("0.00"), invoices=0)
        )
        months[(month, currency)] = replace(row, refunded=row.refunded + value)
    return sorted(months.values(), key=lambda row: (-row.month.toordinal(), row.currency))


@dataclass(frozen=True)
class HeldMoney:
    """Money received that is not revenue and has not gone back yet, now, in one price currency (each amount at the
    rate of the payment it came with)."""

    currency: str
    owed_back: Decimal  # refunds opened and not paid yet (the refunds queue)
    flagged: Decimal  # payments waiting for an operator (the flagged payments)
    pending: Decimal  # part payments whose invoice can still be completed
    dust: Decimal = Decimal(0)  # money that bought nothing, under the dust threshold: noted, kept

    @property
    def total(self) -> Decimal:
        return self.owed_back + self.flagged + self.pending + self.dust


def money_held_or_owed(*, now: datetime | None = None) -> list[HeldMoney]:
    """The report's separate line: what the portal holds or owes back now, per price currency, as the ledger counts
    it (payments/ledger.py): refunds not paid yet, payments flagged for an operator, part payments still open.
    A few queries, whatever the number of refunds; one ledger read per invoice holding money that bought nothing."""
    from payments.ledger import invoice_money

    now = now or timezone.now()
    totals: dict[str, dict[str, Decimal]] = {}

    def add(currency: str, name: str, value: Decimal) -> None:
        bucket = totals.setdefault(
            currency, {"owed_back": Decimal(0), "flagged": Decimal(0), "pending": Decimal(0), "dust": Decimal(0)}
        )
        bucket[name] += value

    open_refunds_rows = Refund.objects.exclude(status=Refund.Status.PAID).values_list(
        "amount_units", "amount_paid_units", "asset_decimals", "rate", "invoice__fiat_currency"
    )
    for units, paid, decimals, rate, currency in open_refunds_rows:
        add(currency, "owed_back", _fiat(max(0, int(units) - int(paid)), decimals, rate))
    holding = (
        Invoice.objects.filter(
            Q(needs_operator=True)  # marked paid too: its money came by another route
            | Q(amount_confirmed_units__gt=0) & ~Q(status__in=[Invoice.Status.SETTLED, Invoice.Status.INVALID])
        )
        .select_related("order")
        .prefetch_related("refunds")
    )
    for invoice in holding:
        money = invoice_money(invoice, order=invoice.order, now=now, refunds=list(invoice.refunds.all()))
        for name in ("flagged", "pending"):
            if getattr(money, name) > 0:
                add(invoice.fiat_currency, name, _fiat(getattr(money, name), invoice.asset_decimals, invoice.rate))
    # Dust (payments/ledger.py): summed in SQL's rows, one query, however many one-unit transfers a stranger sent.
    from django.db.models import F

    from payments.ledger import invoices_with_left

    dust_rows = (
        invoices_with_left(now=now)
        .filter(needs_operator=False, can_complete=False, left_units__gt=0, left_units__lt=F("dust_units"))
        .values_list("left_units", "asset_decimals", "rate", "fiat_currency")
    )
    for units, decimals, rate, currency in dust_rows:
        add(currency, "dust", _fiat(units, decimals, rate))
    return [HeldMoney(currency=currency, **values) for currency, values in sorted(totals.items())]


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
    # Addresses the refund was given before the current one, checksummed: a payout sent to one still pays it.
    previous_addresses: list[str]


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
        previous_addresses=[
            checksum(entry.address) for entry in refund.addresses.all() if entry.address != refund.address
        ],
    )


def order_refunds(order: Order) -> list[RefundView]:
    """An order's refunds for its page, oldest first, with the transactions that paid them."""
    refunds = Refund.objects.filter(order=order).prefetch_related("payments", "addresses")
    return [refund_view(refund) for refund in refunds]


def order_refunds_paid(order: Order) -> bool:
    """Whether the order has refunds and every one of them is paid (its page then says the money went back)."""
    statuses = set(Refund.objects.filter(order=order).values_list("status", flat=True))
    return statuses == {Refund.Status.PAID}


REFUNDS_QUEUE_SIZE = 100


@dataclass
class QueuePage:
    """One page of a console queue: its rows, and the queue's real size (never the length of a capped list: a
    stranger's dust must not push a customer's money out of sight)."""

    items: list
    total: int
    number: int
    pages: int
    size: int

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def first_index(self) -> int:
        return (self.number - 1) * self.size + 1 if self.items else 0

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.items) - 1 if self.items else 0

    @property
    def more(self) -> int:
        """Rows after this page."""
        return max(0, self.total - self.last_index)

    @property
    def previous_number(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next_number(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None


def _queue_page(queryset, *, page: int, size: int, view) -> QueuePage:
    total = queryset.count()
    pages = max(1, -(-total // size))
    number = min(max(1, page), pages)
    rows = list(queryset[(number - 1) * size : number * size])
    return QueuePage(items=[view(row) for row in rows], total=total, number=number, pages=pages, size=size)


def open_refunds(*, page: int = 1) -> QueuePage:
    """The console's refunds queue: every refund not paid yet, oldest first, those worth the dust threshold first
    (a refund of dust opened before the threshold existed waits behind), a page at a time, with its EIP-681 link and
    QR code. A fixed number of queries (the count, refunds, their orders, their payments, their addresses)."""
    from django.db.models import Case, DecimalField, ExpressionWrapper, F, IntegerField, Value, When
    from django.db.models.functions import Power

    from payments.ledger import dust_threshold

    worth = ExpressionWrapper(
        (F("amount_units") - F("amount_paid_units")) * F("rate"),
        output_field=DecimalField(max_digits=100, decimal_places=10),
    )
    threshold = ExpressionWrapper(
        Value(dust_threshold()) * Power(Value(Decimal(10)), F("asset_decimals")),
        output_field=DecimalField(max_digits=100, decimal_places=10),
    )
    refunds = (
        Refund.objects.exclude(status=Refund.Status.PAID)
        .annotate(worth=worth, threshold=threshold)
        .annotate(is_dust=Case(When(worth__lt=F("threshold"), then=1), default=0, output_field=IntegerField()))
        .select_related("order")
        .prefetch_related("payments", "addresses")
        .order_by("is_dust", "created_at", "pk")
    )
    return _queue_page(refunds, page=page, size=REFUNDS_QUEUE_SIZE, view=lambda r: refund_view(r, with_qr=True))


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


# --- payments waiting for an operator (payments/unapplied.py) ---------------------------------------------------


@dataclass
class FlaggedPaymentView:
    invoice: Invoice
    received: str
    due: str
    unapplied: str  # received, not refunded or owed back yet: what "Refund" gives back
    kind: str  # why it waits, in words


FLAGGED_QUEUE_SIZE = 100


def _flagged_kind(invoice: Invoice, received: int) -> str:
    from django.utils.translation import gettext as _

    if invoice.purpose == Invoice.Purpose.EXTENSION:
        return _("Extension payment its order cannot take now")
    if invoice.status == Invoice.Status.INVALID and invoice.order.status not in ("expired",):
        return _("Paid to a replaced quote")
    if received < int(invoice.amount_due_units):
        return _("Partial payment")
    if invoice.paid_late:
        return _("Paid in full after the hold expired")
    return _("Payment its order cannot take now")


def flagged_payments(*, page: int = 1) -> QueuePage:
    """The console's flagged payments: invoices waiting for an operator (refund, or apply to the order), oldest
    first (the longest wait on top), a page at a time with the queue's real size, with what each received and what
    the ledger says waits for the operator (payments/ledger.py)."""
    from payments.ledger import invoice_money

    invoices = (
        Invoice.objects.filter(needs_operator=True)
        .select_related("order")
        .prefetch_related("refunds")
        .order_by("created_at", "pk")
    )

    def view(invoice: Invoice) -> FlaggedPaymentView:
        money = invoice_money(invoice, order=invoice.order, refunds=list(invoice.refunds.all()))
        return FlaggedPaymentView(
            invoice=invoice,
            received=format_units(money.received, invoice.asset_decimals),
            due=format_units(invoice.amount_due_units, invoice.asset_decimals),
            unapplied=format_units(money.flagged, invoice.asset_decimals),
            kind=_flagged_kind(invoice, int(money.received)),
        )

    return _queue_page(invoices, page=page, size=FLAGGED_QUEUE_SIZE, view=view)
