"""The ledger: what an invoice received, what that bought, and where the rest of it is. One rule, read by every
formula that moves money after a payment (docs/architecture.md, "The ledger rule"):

    received = bought + refunded + owed back + flagged + dust (+ pending, while the invoice can still be completed)

- **received**: the base units confirmed on chain to the invoice (an invoice marked paid by an admin received its
  amount due by another route, and what the chain brings on top of what it showed when it was marked).
- **taken**: the invoice's amount due when its order took the payment, that is when the sale took place (its fiscal
  invoice was issued in the settling transaction, payments/settlement.py `_settle`); 0 for a payment that bought
  nothing (a refused extension, a payment to a cancelled, expired or replaced order). Only what was taken bought
  anything: a refused extension's invoice is settled but takes nothing.
- **bought**: taken less what the refunds of its price gave back (cancellation, rejection, provider fault): the
  price of the days actually given, or the fee the terms keep.
- **refunded** / **owed back**: every refund of the invoice, paid (proven on chain) or not yet.
- **flagged**: what is left, when the invoice waits for an operator (`needs_operator`).
- **pending**: what is left, while the invoice can still be completed (its quote is watched and its order still
  takes payments): a first part of a payment is neither bought nor owed yet.
- **dust**: what is left, when it is worth less than `PAYMENTS_DUST_THRESHOLD` in the invoice's price currency at its
  rate: noted on the order and counted in the reports, neither flagged nor refunded (a stranger's one-unit
  transfers would otherwise fill the console's queues and e-mail the customer for each).

What is left after all that is **unaccounted**: money kept in silence, a breach. So are refunds of an invoice's price
beyond what its order took, and refunds beyond what it received. Amounts are base units of the invoice's asset
(exact integers, held as Decimal); the fiat figures (`price`, `bought_price`) are what the cancellation rules, the
provider-fault remedy and the revenue read.
"""

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from booking.models import Order, OrderStatus
from payments.models import FiscalInvoice, Invoice, Refund

ZERO = Decimal(0)

# The refunds that give back (part of) an invoice's price, within what its order took: the cancellation's, the
# rejection's, a provider fault's. Every other refund gives back money that bought nothing (an overpayment, a
# payment after settlement or to a closed order, a refused extension).
PRICE_REFUND_REASONS = (
    Refund.Reason.CANCELLATION,
    Refund.Reason.REJECTION,
    Refund.Reason.PROVIDER_FAULT,
)

# An order in one of these takes no more payments: money that reached it and bought nothing goes back.
CLOSED_STATUSES = frozenset({OrderStatus.CANCELLED, OrderStatus.REJECTED, OrderStatus.ENDED})


@dataclass(frozen=True)
class InvoiceMoney:
    """Where an invoice's money is, in base units of its asset (Decimal integers), and its price in fiat."""

    invoice_id: int
    received: Decimal
    taken: Decimal
    bought: Decimal
    refunded: Decimal
    owed_back: Decimal
    flagged: Decimal
    pending: Decimal
    unaccounted: Decimal
    price_refunds: Decimal  # units: the part of refunded + owed back that gives back the price
    other_refunds: Decimal  # units: the part that gives back money beyond the price (it bought nothing)
    price: Decimal  # fiat: what the invoice asked
    bought_price: Decimal  # fiat: the price taken, less the refunds of the price (fiat as each was fixed)
    dust: Decimal = ZERO  # units: left, worth less than the dust threshold: noted, kept

    @property
    def is_taken(self) -> bool:
        return self.taken > 0

    @property
    def refunds(self) -> Decimal:
        return self.refunded + self.owed_back

    def breaches(self) -> list[str]:
        """The ways this invoice breaks the ledger rule, in words (empty: it holds)."""
        found = []
        total = (
            self.bought + self.refunded + self.owed_back + self.flagged + self.pending + self.dust + self.unaccounted
        )
        if total != self.received:  # by construction; kept so that a change to this module cannot hide a hole
            found.append(f"invoice {self.invoice_id}: received {self.received} but the parts add up to {total}")
        if self.unaccounted > 0:
            found.append(f"invoice {self.invoice_id}: {self.unaccounted} units received are kept in silence")
        elif self.unaccounted < 0:  # refunds gave back money that bought time, though under what it received
            found.append(
                f"invoice {self.invoice_id}: bought {self.bought} + refunds {self.refunds} exceed what it received "
                f"{self.received} by {-self.unaccounted}"
            )
        if self.refunds > self.received:
            found.append(f"invoice {self.invoice_id}: refunds {self.refunds} exceed what it received {self.received}")
        if self.price_refunds > self.taken:
            found.append(
                f"invoice {self.invoice_id}: refunds of its price {self.price_refunds} exceed what its order took "
                f"{self.taken}"
            )
        if self.taken > self.received:
            found.append(f"invoice {self.invoice_id}: its order took {self.taken}, it received {self.received}")
        if self.bought_price < 0:
            found.append(f"invoice {self.invoice_id}: refunds of its price exceed its price ({self.bought_price})")
        return found


def invoice_received_units(invoice: Invoice) -> int:
    """What the invoice received: its confirmed base units; for one an admin marked paid, the amount due by another
    route (or the transfer the chain showed then, when it was more), and every unit confirmed on chain beyond what
    the chain showed when it was marked: money on top of a payment made elsewhere, which bought nothing."""
    received = int(invoice.amount_confirmed_units)
    if not invoice.marked:
        return received
    if invoice.marked_chain_units is None:  # marked before the chain's figure was recorded: its transfers count
        return max(received, int(invoice.amount_due_units))
    counted = min(received, int(invoice.marked_chain_units))
    return max(counted, int(invoice.amount_due_units)) + (received - counted)


def dust_threshold() -> Decimal:
    """The fiat value (in an invoice's price currency) under which money that bought nothing is dust."""
    return Decimal(str(getattr(settings, "PAYMENTS_DUST_THRESHOLD", "1.00")))


def units_fiat(invoice: Invoice, units: int | Decimal) -> Decimal:
    """`units` of the invoice's asset in its price currency, at its rate."""
    return Decimal(int(units)).scaleb(-invoice.asset_decimals) * invoice.rate


def is_dust(invoice: Invoice, units: int | Decimal) -> bool:
    """Whether `units` (> 0) of the invoice's asset are worth less than the dust threshold, at its rate."""
    return int(units) > 0 and units_fiat(invoice, units) < dust_threshold()


def invoice_is_taken(invoice: Invoice) -> bool:
    """Whether the order took this payment: the sale took place, and its fiscal invoice was numbered with it."""
    if invoice.status != Invoice.Status.SETTLED:
        return False
    return FiscalInvoice.objects.filter(payment=invoice, kind=FiscalInvoice.Kind.INVOICE).exists()


def _can_still_complete(invoice: Invoice, order: Order, now: datetime) -> bool:
    if order.status in CLOSED_STATUSES or now >= invoice.monitor_until:
        return False
    return invoice.status in (Invoice.Status.NEW, Invoice.Status.PROCESSING, Invoice.Status.EXPIRED)


def invoice_money(
    invoice: Invoice,
    *,
    order: Order | None = None,
    now: datetime | None = None,
    refunds: list[Refund] | None = None,
) -> InvoiceMoney:
    """What `invoice` received and where that money is. Reads the invoice (and `order`, when the caller holds it
    locked) as given: a caller that changed its confirmed amount sees the new figure; its refunds come from the
    database."""
    now = now or timezone.now()
    order = order or invoice.order
    if refunds is None:
        refunds = list(Refund.objects.filter(invoice=invoice))
    received = Decimal(invoice_received_units(invoice))
    taken = Decimal(int(invoice.amount_due_units)) if invoice_is_taken(invoice) else ZERO
    price_refunds = sum((Decimal(int(r.amount_units)) for r in refunds if r.reason in PRICE_REFUND_REASONS), ZERO)
    other_refunds = sum((Decimal(int(r.amount_units)) for r in refunds if r.reason not in PRICE_REFUND_REASONS), ZERO)
    refunded = sum((Decimal(min(int(r.amount_paid_units), int(r.amount_units))) for r in refunds), ZERO)
    owed_back = sum((Decimal(r.amount_left_units) for r in refunds), ZERO)
    price_refunded_fiat = sum(
        (r.fiat_amount or ZERO for r in refunds if r.reason in PRICE_REFUND_REASONS),
        ZERO,
    )
    bought = taken - price_refunds
    left = received - bought - refunded - owed_back
    flagged = pending = dust = unaccounted = ZERO
    if left > 0 and invoice.needs_operator:
        flagged = left
    elif left > 0 and not taken and _can_still_complete(invoice, order, now):
        pending = left
    elif is_dust(invoice, left):
        dust = left
    else:
        unaccounted = left  # negative: more went back than came in (a breach too)
    return InvoiceMoney(
        invoice_id=invoice.pk,
        received=received,
        taken=taken,
        bought=bought,
        refunded=refunded,
        owed_back=owed_back,
        flagged=flagged,
        pending=pending,
        unaccounted=unaccounted,
        price_refunds=price_refunds,
        other_refunds=other_refunds,
        price=invoice.fiat_amount,
        bought_price=(invoice.fiat_amount - price_refunded_fiat) if taken else -price_refunded_fiat,
        dust=dust,
    )


@dataclass(frozen=True)
class OrderMoney:
    """The sum of an order's invoices, and each of them (oldest first)."""

    invoices: tuple[InvoiceMoney, ...]

    def _sum(self, name: str) -> Decimal:
        return sum((getattr(money, name) for money in self.invoices), ZERO)

    @property
    def window_price(self) -> Decimal:
        """Fiat: what the taken invoices asked for the window (the booking and its extensions given), before any
        refund: the base of the provider-fault remedy's pro rata."""
        return sum((money.price for money in self.invoices if money.is_taken), ZERO)

    @property
    def bought_price(self) -> Decimal:
        """Fiat: what is left of the window's price once the refunds of the price are given back: the base of the
        cancellation rules."""
        return sum((money.bought_price for money in self.invoices if money.is_taken), ZERO)

    def breaches(self) -> list[str]:
        return [breach for money in self.invoices for breach in money.breaches()]

    # The order's sums. Units of different assets never mix in practice: an order's invoices share the asset it
    # was placed with unless the researcher switched before paying; read `invoices` one by one to be exact.
    received = property(lambda self: self._sum("received"))
    taken = property(lambda self: self._sum("taken"))
    bought = property(lambda self: self._sum("bought"))
    refunded = property(lambda self: self._sum("refunded"))
    owed_back = property(lambda self: self._sum("owed_back"))
    flagged = property(lambda self: self._sum("flagged"))
    pending = property(lambda self: self._sum("pending"))
    dust = property(lambda self: self._sum("dust"))
    unaccounted = property(lambda self: self._sum("unaccounted"))
    refunds = property(lambda self: self._sum("refunded") + self._sum("owed_back"))


def order_money(order: Order, *, now: datetime | None = None) -> OrderMoney:
    """Every invoice of `order`, through `invoice_money`, oldest first."""
    now = now or timezone.now()
    invoices = list(Invoice.objects.filter(order=order).select_related("order").order_by("created_at", "pk"))
    refunds: dict[int, list[Refund]] = {}
    for refund in Refund.objects.filter(order=order):
        refunds.setdefault(refund.invoice_id, []).append(refund)
    return OrderMoney(
        invoices=tuple(invoice_money(invoice, now=now, refunds=refunds.get(invoice.pk, [])) for invoice in invoices)
    )


def invoices_with_left(*, now: datetime | None = None):
    """Every invoice annotated, in SQL, with the ledger's remainder when nothing waits for an operator:
    `left_units` (what it received beyond what its order took, less the refunds of that money; marked invoices as
    if their transfers counted toward the mark), `dust_units` (what the dust threshold is worth in its units),
    `can_complete` (pending: still watched on an order that takes payments) and `refunds_of_price` (units). For
    the sweep and the reports: a stranger's dust must neither fill the sweep's batch nor cost a ledger read per
    invoice."""
    from django.db.models import (
        BooleanField,
        Case,
        DecimalField,
        Exists,
        ExpressionWrapper,
        F,
        OuterRef,
        Q,
        Subquery,
        Sum,
        Value,
        When,
    )
    from django.db.models.functions import Coalesce, Power

    now = now or timezone.now()
    units = Invoice._meta.get_field("amount_confirmed_units")

    def refunds_sum(**reason_filter):
        return Coalesce(
            Subquery(
                Refund.objects.filter(invoice=OuterRef("pk"), **reason_filter)
                .values("invoice")
                .annotate(total=Sum("amount_units"))
                .values("total")
            ),
            0,
            output_field=units,
        )

    beyond_price = [reason for reason in Refund.Reason.values if reason not in PRICE_REFUND_REASONS]
    taken = Exists(FiscalInvoice.objects.filter(payment=OuterRef("pk"), kind=FiscalInvoice.Kind.INVOICE))
    still_open = Q(
        status__in=[Invoice.Status.NEW, Invoice.Status.PROCESSING, Invoice.Status.EXPIRED], monitor_until__gt=now
    ) & ~Q(order__status__in=CLOSED_STATUSES)
    return Invoice.objects.annotate(
        taken=taken,
        refunds_all=refunds_sum(),
        refunds_beyond_price=refunds_sum(reason__in=beyond_price),
        refunds_of_price=refunds_sum(reason__in=PRICE_REFUND_REASONS),
        dust_units=ExpressionWrapper(
            Value(dust_threshold()) * Power(Value(Decimal(10)), F("asset_decimals")) / F("rate"),
            output_field=DecimalField(max_digits=100, decimal_places=10),
        ),
        left_units=Case(
            When(taken=True, then=F("amount_confirmed_units") - F("amount_due_units") - F("refunds_beyond_price")),
            default=F("amount_confirmed_units") - F("refunds_all"),
            output_field=units,
        ),
        can_complete=ExpressionWrapper(Q(taken=False) & still_open, output_field=BooleanField()),
    )
