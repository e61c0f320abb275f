"""Fiscal invoices: the numbered document a settled payment issues (not `Invoice`, the payment request), and the
billing details it is made out to, changeable until then.

`fiscal_invoice_issue` runs inside the settling transaction (`settlement._settle`), after the order and the
payment request are locked: it takes the next number of the year's series of the prefix set now
(`FiscalInvoiceSeries`), locked last (so the lock that serialises every settlement of the year is held only for the
few statements that follow), reads the issue date under that lock (numbers follow their dates, whatever clock the
caller read), and writes the figures once. A settlement that rolls back gives its number back: numbers have no gap
and no duplicate in their series; a new prefix starts its own. The PDF
(payments/fiscal_documents.py) is written after the commit, by a task, and e-mailed.

VAT: the catalog's prices include the VAT where it is due, so a customer pays the same price whatever their VAT
status; the invoice splits it. A buyer in the seller's country, or an EU buyer without a VAT number, pays VAT at the
operator's rate (category S); an EU business buyer of another member state with a VAT number is invoiced under
reverse charge (AE, "Autoliquidation"); a buyer outside the EU pays no VAT (G).

An issued invoice is corrected by a credit note (`fiscal_credit_note_issue`), issued when a paid order is cancelled
or rejected (the reaction to its transition, connected in payments/apps.py) for what is owed back.
"""

from dataclasses import asdict
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from django.db import transaction
from django.db.models import Sum
from django.db.models.functions import Coalesce
from django.utils import timezone, translation
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from booking import billing
from booking.locks import lock_order
from booking.models import Order, OrderEvent, OrderStatus
from booking.rules import BookingError
from payments import enqueue
from payments.models import FiscalInvoice, FiscalInvoiceSeries, Invoice, InvoicingSettings, Transfer

CENT = Decimal("0.01")


def vat_treatment(*, seller_country: str, buyer: billing.BillingDetails, rate: Decimal) -> tuple[str, Decimal]:
    """(EN 16931 VAT category, rate) for this buyer."""
    if buyer.country and buyer.country != seller_country and not buyer.in_eu:
        return FiscalInvoice.VatCategory.OUTSIDE_EU, Decimal("0.00")
    if buyer.in_eu and buyer.country != seller_country and buyer.vat_number:
        return FiscalInvoice.VatCategory.REVERSE_CHARGE, Decimal("0.00")
    return FiscalInvoice.VatCategory.STANDARD, rate


def vat_mention(category: str) -> str:
    """The legal mention a VAT exemption must carry, in the active language."""
    if category == FiscalInvoice.VatCategory.REVERSE_CHARGE:
        return _(
            "Reverse charge (Autoliquidation): VAT is due by the customer, article 196 of Council Directive "
            "2006/112/EC."
        )
    if category == FiscalInvoice.VatCategory.OUTSIDE_EU:
        return _(
            "VAT not applicable: services supplied to a customer established outside the European Union "
            "(article 44 of Council Directive 2006/112/EC)."
        )
    return ""


def split_gross(*, gross: Decimal, rate: Decimal) -> tuple[Decimal, Decimal]:
    """(net, VAT) of a price that includes VAT at `rate` percent, such that the VAT is the net times the rate
    rounded to the cent (EN 16931 BR-CO-17) and both add up to what was paid, whenever a net allows it."""
    if not rate:
        return gross, Decimal("0.00")
    estimate = (gross * 100 / (100 + rate)).quantize(CENT, ROUND_HALF_UP)
    for net in (estimate, estimate - CENT, estimate + CENT):
        vat = (net * rate / 100).quantize(CENT, ROUND_HALF_UP)
        if net + vat == gross:
            return net, vat
    return estimate, gross - estimate


def credit_split(
    *, remaining_net: Decimal, remaining_vat: Decimal, amount: Decimal, rate: Decimal
) -> tuple[Decimal, Decimal]:
    """(net, VAT) of a credit of `amount` on an invoice of which `remaining_net` + `remaining_vat` is not credited
    yet: what is left after the credit is split as a price is (`split_gross`), and the note takes the difference. A
    sale credited in several notes then nets to exactly zero net and zero VAT, where splitting each note on its own
    could leave a cent of each on opposite sides (100.01 credited as 50.00 + 50.01 at 20 %: 83.35 net and 16.66
    VAT credited on 83.34 and 16.67 invoiced)."""
    left_net, left_vat = split_gross(gross=remaining_net + remaining_vat - amount, rate=rate)
    return remaining_net - left_net, remaining_vat - left_vat


def _lines(*, order: Order, invoice: Invoice) -> list[dict]:
    days = invoice.extension_days if invoice.purpose == Invoice.Purpose.EXTENSION else order.days
    unit_price = (invoice.fiat_amount / order.lot_count).quantize(Decimal("0.0001"))
    if unit_price == unit_price.quantize(CENT):  # shown as a price, unless the division leaves a fraction of a cent
        unit_price = unit_price.quantize(CENT)
    if invoice.purpose == Invoice.Purpose.EXTENSION:
        description = ngettext(
            "%(hardware)s, extension of order %(number)s by %(days)s day",
            "%(hardware)s, extension of order %(number)s by %(days)s days",
            days,
        )
    elif order.start_when_ready and order.clock_started_at is None:  # its days count from the hand-over
        description = ngettext(
            "%(hardware)s for %(days)s day from the hand-over (planned for %(start)s UTC), order %(number)s",
            "%(hardware)s for %(days)s days from the hand-over (planned for %(start)s UTC), order %(number)s",
            days,
        )
    else:
        description = ngettext(
            "%(hardware)s for %(days)s day from %(start)s UTC, order %(number)s",
            "%(hardware)s for %(days)s days from %(start)s UTC, order %(number)s",
            days,
        )
    description %= {
        "hardware": order.hardware_class.name,
        "number": order.public_id,
        "days": days,
        "start": order.starts_at.strftime("%Y-%m-%d %H:%M"),
    }
    return [
        {
            "description": description,
            "quantity": order.lot_count,
            "days": days,
            "unit_price_gross": str(unit_price),
            "amount_gross": str(invoice.fiat_amount),
        }
    ]


def _payment_amount(invoice: Invoice) -> str:
    """What was received, in whole coins, exactly (an admin's "mark paid" without a transfer: the amount due)."""
    units = int(invoice.amount_confirmed_units) or int(invoice.amount_due_units)
    return f"{Decimal(units).scaleb(-invoice.asset_decimals).normalize():f}"


def _take_number(*, prefix: str) -> tuple[int, int, str, datetime]:
    """The next number of the prefix's series and its issue date, read under the series' lock: an invoice numbered
    later is dated later (CGI art. 242 nonies A), whatever clock the caller read before (a scan cycle reads its own
    once, at its start). The number's year is its date's: a wait for the lock across New Year's Eve moves on to the
    new year's series (years are locked in ascending order). Each prefix has its own series: the one set now,
    whatever the documents issued under an earlier prefix (they keep theirs)."""
    year = timezone.now().year
    while True:
        FiscalInvoiceSeries.objects.bulk_create([FiscalInvoiceSeries(prefix=prefix, year=year)], ignore_conflicts=True)
        series = FiscalInvoiceSeries.objects.select_for_update().get(prefix=prefix, year=year)
        issued_at = timezone.now()
        if issued_at.year == year:
            break
        year = issued_at.year
    series.last_sequence += 1
    series.save(update_fields=["last_sequence"])
    return year, series.last_sequence, f"{prefix}-{year}-{series.last_sequence:06d}", issued_at


def _settings_locked() -> InvoicingSettings:
    """The invoicing settings, their row locked until the caller's transaction ends: the seller, VAT rate and
    prefix a document is issued with are the ones in force when it is numbered. The admin's change locks the same row
    (payments/fiscal_admin.py), so a change waits for the documents being numbered, and every document numbered
    after it was saved reads it: the settings' history says truly which prefix and rate each was issued under."""
    InvoicingSettings.current()  # the row exists
    return InvoicingSettings.objects.select_for_update().get(pk=1)


def fiscal_invoice_issue(*, order: Order, invoice: Invoice, now: datetime) -> FiscalInvoice:
    """Issue the fiscal invoice of a settled payment request, in the settling transaction (order and payment request
    locked by the caller). Issued once per payment request; its PDF is written and e-mailed after the commit."""
    existing = FiscalInvoice.objects.filter(payment=invoice).first()
    if existing is not None:
        return existing
    seller = _settings_locked()  # before the series' lock: settings, then series, always
    buyer = billing.billing_details_of(order)
    category, rate = vat_treatment(seller_country=seller.seller_country, buyer=buyer, rate=seller.vat_rate_percent)
    gross = invoice.fiat_amount
    net, vat = split_gross(gross=gross, rate=rate)
    with translation.override(order.language):
        lines = _lines(order=order, invoice=invoice)
        mention = vat_mention(category)
    tx_hashes = list(
        invoice.transfers.filter(status=Transfer.Status.CONFIRMED, wrong_asset=False)
        .order_by("block_number", "log_index")
        .values_list("tx_hash", flat=True)
    )
    year, sequence, number, issued_at = _take_number(prefix=seller.number_prefix)  # the last lock taken
    fiscal_invoice = FiscalInvoice.objects.create(
        number=number,
        prefix=seller.number_prefix,
        year=year,
        sequence=sequence,
        order=order,
        payment=invoice,
        issued_at=issued_at,
        language=order.language,
        seller={
            "name": seller.seller_name,
            "address": seller.seller_address,
            "country": seller.seller_country,
            "vat_number": seller.seller_vat_number,
            "registration": seller.seller_registration,
            "legal_mentions": seller.legal_mentions,
        },
        buyer={**asdict(buyer), "contact_name": order.contact_name, "email": order.contact_email},
        lines=lines,
        currency=invoice.fiat_currency,
        vat_category=category,
        vat_rate=rate,
        vat_mention=mention,
        total_net=net,
        vat_amount=vat,
        total_gross=gross,
        payment_chain_id=invoice.chain_id,
        payment_asset=invoice.asset_symbol,
        payment_amount=_payment_amount(invoice),
        payment_tx_hashes=list(dict.fromkeys(tx_hashes)),
        payment_rate=invoice.rate,
        payment_rate_source=invoice.rate_source,
        paid_at=invoice.settled_at or now,
    )
    fiscal_invoice_id = fiscal_invoice.pk
    _write_document(fiscal_invoice_id)  # queued once the transaction commits
    return fiscal_invoice


def fiscal_credit_note_issue(*, invoice: FiscalInvoice, amount: Decimal, reason: str) -> FiscalInvoice | None:
    """A credit note correcting `invoice` by `amount` (at most what it has not credited yet), in the caller's
    transaction with the order locked: numbered in the series of the prefix set now, same buyer, seller and VAT
    treatment (category and rate) as the invoice it names, its net and VAT split on what the invoice has left
    (`credit_split`), so the notes of a fully credited invoice add up to its net and VAT. None when nothing is left
    to credit."""
    credited = invoice.credit_notes.aggregate(
        gross=Coalesce(Sum("total_gross"), Decimal(0)),
        net=Coalesce(Sum("total_net"), Decimal(0)),
        vat=Coalesce(Sum("vat_amount"), Decimal(0)),
    )
    amount = min(amount, invoice.total_gross - credited["gross"])
    if amount <= 0:
        return None
    net, vat = credit_split(
        remaining_net=invoice.total_net - credited["net"],
        remaining_vat=invoice.vat_amount - credited["vat"],
        amount=amount,
        rate=invoice.vat_rate,
    )
    with translation.override(invoice.language):
        description = _("Credit on invoice %(number)s of %(date)s: %(reason)s") % {
            "number": invoice.number,
            "date": invoice.issued_at.strftime("%Y-%m-%d"),
            "reason": reason,
        }
    seller = _settings_locked()
    year, sequence, number, issued_at = _take_number(prefix=seller.number_prefix)  # dated when numbered, as invoices
    credit_note = FiscalInvoice.objects.create(
        kind=FiscalInvoice.Kind.CREDIT_NOTE,
        number=number,
        prefix=seller.number_prefix,
        year=year,
        sequence=sequence,
        order=invoice.order,
        corrects=invoice,
        reason=reason,
        issued_at=issued_at,
        language=invoice.language,
        seller=invoice.seller,
        buyer=invoice.buyer,
        lines=[
            {
                "description": description,
                "quantity": 1,
                "days": "",
                "unit_price_gross": str(amount),
                "amount_gross": str(amount),
            }
        ],
        currency=invoice.currency,
        vat_category=invoice.vat_category,
        vat_rate=invoice.vat_rate,
        vat_mention=invoice.vat_mention,
        total_net=net,
        vat_amount=vat,
        total_gross=amount,
        payment_chain_id=invoice.payment_chain_id,
        payment_asset=invoice.payment_asset,
        payment_amount=invoice.payment_amount,
        payment_tx_hashes=invoice.payment_tx_hashes,
        payment_rate=invoice.payment_rate,
        payment_rate_source=invoice.payment_rate_source,
        paid_at=invoice.paid_at,
    )
    credit_note_id = credit_note.pk
    _write_document(credit_note_id)  # queued once the transaction commits
    return credit_note


# Paid for and then called off: what is owed back is credited on the invoices (settlement flags the refund itself).
CREDITED_STATUSES = frozenset({OrderStatus.CANCELLED, OrderStatus.REJECTED})


def on_order_status_changed(*, order_id: int, to_status: str, **kwargs) -> None:
    if to_status in CREDITED_STATUSES:
        fiscal_credit_notes_for_refund(order_id=order_id)


@transaction.atomic
def fiscal_credit_notes_for_refund(*, order_id: int) -> list[FiscalInvoice]:
    """Credit notes follow the refunds: each fiscal invoice of a cancelled or rejected order is credited by what
    the refunds of its price add up to (payments/refunds.py PRICE_REFUND_REASONS: the cancellation's, the
    rejection's, a provider fault's), less what its credit notes credit already. Run again, it credits nothing
    more; a refund given later (a cancellation after a provider-fault refund) is credited then."""
    from payments.refunds import PRICE_REFUND_REASONS

    order = lock_order(order_id)
    invoices = FiscalInvoice.objects.filter(order=order, kind=FiscalInvoice.Kind.INVOICE, payment__isnull=False)
    reason = (
        gettext_lazy("order cancelled, refund by the cancellation policy")
        if order.status == OrderStatus.CANCELLED and order.refund_due is not None
        else gettext_lazy("order cancelled or refused: paid amount refunded")
    )
    notes = []
    for invoice in invoices.select_related("payment").order_by("year", "sequence"):
        refunded = invoice.payment.refunds.filter(reason__in=PRICE_REFUND_REASONS, fiat_amount__isnull=False)
        owed = sum((refund.fiat_amount for refund in refunded), Decimal(0))
        owed -= sum((note.total_gross for note in invoice.credit_notes.all()), Decimal(0))
        if owed <= 0:
            continue
        with translation.override(invoice.language):
            reason_text = str(reason)
        note = fiscal_credit_note_issue(invoice=invoice, amount=owed, reason=reason_text)
        if note is not None:
            notes.append(note)
    return notes


def _write_document(fiscal_invoice_id: int) -> None:
    enqueue.issue_fiscal_document(fiscal_invoice_id)


@transaction.atomic
def order_billing_change(*, order: Order, details: billing.BillingDetails) -> bool:
    """Change who the invoice is made out to, until it is issued: the order is locked, as the settling transaction
    locks it before issuing, so a change and an issue never cross. False when nothing changed."""
    order = lock_order(order.pk)
    if FiscalInvoice.objects.filter(order=order).exists():
        raise BookingError(
            _(
                "The invoice of this order is already issued: its billing details can no longer change. Write to "
                "the operators if it must be corrected (they issue a credit note and a new invoice)."
            )
        )
    return billing.order_billing_set(order=order, billing=details, actor_kind=OrderEvent.Actor.CUSTOMER)


def fiscal_invoices_of(order: Order) -> list[FiscalInvoice]:
    """The order's issued invoices, oldest first, without their PDFs (the order page lists them)."""
    return list(FiscalInvoice.objects.filter(order=order).defer("pdf").order_by("year", "sequence"))


def fiscal_invoice_of(*, order: Order, number: str) -> FiscalInvoice | None:
    return FiscalInvoice.objects.filter(order=order, number=number[:32]).select_related("order").first()
