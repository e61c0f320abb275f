"""The document of an issued fiscal invoice: a PDF/A-3 carrying its EN 16931 XML (Factur-X, profile EN 16931),
written once after the settling transaction commits, kept with its SHA-256 and never regenerated, then e-mailed.

The XML is built here from the invoice's frozen figures and checked against the EN 16931 schema shipped with the
`factur-x` library. The page printed to PDF is drawn by the presentation layer (a template in web/), asked for
through the `document_html` signal that web/apps.py connects, as notices are written: payments renders no template.
WeasyPrint prints it as PDF/A-3b (fonts embedded, sRGB output intent), and factur-x embeds the XML with the
Factur-X XMP metadata.
"""

import hashlib
import logging
from datetime import timedelta
from decimal import Decimal

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.db.models import Q
from django.dispatch import Signal
from django.utils import timezone
from lxml import etree

from payments.models import FiscalDocumentFailure, FiscalInvoice

logger = logging.getLogger(__name__)

FACTURX_LEVEL = "en16931"
_NS = {
    "rsm": "urn:un:unece:uncefact:data:standard:CrossIndustryInvoice:100",
    "ram": "urn:un:unece:uncefact:data:standard:ReusableAggregateBusinessInformationEntity:100",
    "qdt": "urn:un:unece:uncefact:data:standard:QualifiedDataType:100",
    "udt": "urn:un:unece:uncefact:data:standard:UnqualifiedDataType:100",
}
_EXEMPTION_CODES = {
    FiscalInvoice.VatCategory.REVERSE_CHARGE: "VATEX-EU-AE",
    FiscalInvoice.VatCategory.OUTSIDE_EU: "VATEX-EU-G",
}

# The HTML page of an invoice, to print: one receiver (web/apps.py), answering `invoice=` with a str.
document_html = Signal()


def _el(parent, tag: str, text: str | None = None, **attributes) -> etree._Element:
    prefix, name = tag.split(":")
    element = etree.SubElement(parent, f"{{{_NS[prefix]}}}{name}", **attributes)
    if text is not None:
        element.text = text
    return element


def _date(parent, tag: str, moment) -> None:
    _el(_el(parent, tag), "udt:DateTimeString", moment.strftime("%Y%m%d"), format="102")


def _party(parent, tag: str, *, name: str, address: str, country: str, vat_number: str, legal_id: str = "") -> None:
    party = _el(parent, tag)
    _el(party, "ram:Name", name)
    if legal_id:
        _el(_el(party, "ram:SpecifiedLegalOrganization"), "ram:ID", legal_id)
    postal = _el(party, "ram:PostalTradeAddress")
    lines = [line for line in address.split("\n") if line.strip()]
    for tag_name, line in zip(
        ("ram:LineOne", "ram:LineTwo", "ram:LineThree"), [*lines[:2], ", ".join(lines[2:])], strict=False
    ):
        if line:
            _el(postal, tag_name, line)
    _el(postal, "ram:CountryID", country)
    if vat_number:
        _el(_el(party, "ram:SpecifiedTaxRegistration"), "ram:ID", vat_number, schemeID="VA")


def _money(amount) -> str:
    return f"{amount:.2f}"


def facturx_xml(fiscal_invoice: FiscalInvoice) -> bytes:
    """The invoice as EN 16931 CII XML (Factur-X profile EN 16931), from the figures frozen at issue."""
    fi, seller, buyer = fiscal_invoice, fiscal_invoice.seller, fiscal_invoice.buyer
    root = etree.Element(f"{{{_NS['rsm']}}}CrossIndustryInvoice", nsmap=_NS)
    context = _el(root, "rsm:ExchangedDocumentContext")
    _el(_el(context, "ram:GuidelineSpecifiedDocumentContextParameter"), "ram:ID", "urn:cen.eu:en16931:2017")
    document = _el(root, "rsm:ExchangedDocument")
    _el(document, "ram:ID", fi.number)
    _el(document, "ram:TypeCode", "381" if fi.is_credit_note else "380")  # credit note, commercial invoice
    _date(document, "ram:IssueDateTime", fi.issued_at)
    notes = [
        fi.vat_mention,
        f"Credit note correcting invoice {fi.corrects.number}: {fi.reason}" if fi.is_credit_note else "",
        f"Paid on chain {fi.payment_chain_id}: {fi.payment_amount} {fi.payment_asset} at {fi.payment_rate_text} "
        f"{fi.currency} per {fi.payment_asset} ({fi.payment_rate_source}); transactions: "
        f"{', '.join(fi.payment_tx_hashes) or 'recorded by the operator'}.",
        seller.get("legal_mentions", ""),
    ]
    for note in filter(None, notes):
        _el(_el(document, "ram:IncludedNote"), "ram:Content", note)
    transaction = _el(root, "rsm:SupplyChainTradeTransaction")
    net_factor = fi.total_net / fi.total_gross if fi.total_gross else 1
    for index, line in enumerate(fi.lines, start=1):
        item = _el(transaction, "ram:IncludedSupplyChainTradeLineItem")
        _el(_el(item, "ram:AssociatedDocumentLineDocument"), "ram:LineID", str(index))
        _el(_el(item, "ram:SpecifiedTradeProduct"), "ram:Name", line["description"])
        agreement = _el(item, "ram:SpecifiedLineTradeAgreement")
        line_net = fi.total_net if len(fi.lines) == 1 else (net_factor * Decimal(line["amount_gross"]))
        unit_net = (line_net / line["quantity"]).quantize(Decimal("0.0001"))
        _el(_el(agreement, "ram:NetPriceProductTradePrice"), "ram:ChargeAmount", f"{unit_net}")
        _el(_el(item, "ram:SpecifiedLineTradeDelivery"), "ram:BilledQuantity", str(line["quantity"]), unitCode="C62")
        settlement = _el(item, "ram:SpecifiedLineTradeSettlement")
        tax = _el(settlement, "ram:ApplicableTradeTax")
        _el(tax, "ram:TypeCode", "VAT")
        if fi.vat_category in _EXEMPTION_CODES:
            _el(tax, "ram:ExemptionReason", fi.vat_mention)
        _el(tax, "ram:CategoryCode", fi.vat_category)
        if fi.vat_category in _EXEMPTION_CODES:
            _el(tax, "ram:ExemptionReasonCode", _EXEMPTION_CODES[fi.vat_category])
        _el(tax, "ram:RateApplicablePercent", _money(fi.vat_rate))
        summation = _el(settlement, "ram:SpecifiedTradeSettlementLineMonetarySummation")
        _el(summation, "ram:LineTotalAmount", _money(line_net))
    agreement = _el(transaction, "ram:ApplicableHeaderTradeAgreement")
    if buyer.get("purchase_order"):
        _el(agreement, "ram:BuyerReference", buyer["purchase_order"])
    _party(
        agreement,
        "ram:SellerTradeParty",
        name=seller["name"],
        address=seller["address"],
        country=seller["country"],
        vat_number=seller["vat_number"],
        legal_id=seller.get("registration", ""),
    )
    _party(
        agreement,
        "ram:BuyerTradeParty",
        name=buyer["organisation"],
        address=buyer["address"],
        country=buyer["country"] or seller["country"],
        vat_number=buyer.get("vat_number", ""),
    )
    if buyer.get("purchase_order"):
        _el(_el(agreement, "ram:BuyerOrderReferencedDocument"), "ram:IssuerAssignedID", buyer["purchase_order"])
    delivery = _el(transaction, "ram:ApplicableHeaderTradeDelivery")
    _date(_el(delivery, "ram:ActualDeliverySupplyChainEvent"), "ram:OccurrenceDateTime", fi.order.starts_at)
    settlement = _el(transaction, "ram:ApplicableHeaderTradeSettlement")
    _el(settlement, "ram:InvoiceCurrencyCode", fi.currency)
    tax = _el(settlement, "ram:ApplicableTradeTax")
    _el(tax, "ram:CalculatedAmount", _money(fi.vat_amount))
    _el(tax, "ram:TypeCode", "VAT")
    if fi.vat_category in _EXEMPTION_CODES:
        _el(tax, "ram:ExemptionReason", fi.vat_mention)
    _el(tax, "ram:BasisAmount", _money(fi.total_net))
    _el(tax, "ram:CategoryCode", fi.vat_category)
    if fi.vat_category in _EXEMPTION_CODES:
        _el(tax, "ram:ExemptionReasonCode", _EXEMPTION_CODES[fi.vat_category])
    _el(tax, "ram:RateApplicablePercent", _money(fi.vat_rate))
    if fi.is_credit_note:  # an amount is due (to the buyer): EN 16931 BR-CO-25 asks for the payment terms
        _el(
            _el(settlement, "ram:SpecifiedTradePaymentTerms"),
            "ram:Description",
            f"Refunded on chain {fi.payment_chain_id} in {fi.payment_asset} at the rate of invoice "
            f"{fi.corrects.number}, to the address the buyer confirms on the order page.",
        )
    totals = _el(settlement, "ram:SpecifiedTradeSettlementHeaderMonetarySummation")
    _el(totals, "ram:LineTotalAmount", _money(fi.total_net))
    _el(totals, "ram:TaxBasisTotalAmount", _money(fi.total_net))
    _el(totals, "ram:TaxTotalAmount", _money(fi.vat_amount), currencyID=fi.currency)
    _el(totals, "ram:GrandTotalAmount", _money(fi.total_gross))
    if fi.is_credit_note:  # owed back to the buyer
        _el(totals, "ram:DuePayableAmount", _money(fi.total_gross))
        referenced = _el(settlement, "ram:InvoiceReferencedDocument")
        _el(referenced, "ram:IssuerAssignedID", fi.corrects.number)
        _el(
            _el(referenced, "ram:FormattedIssueDateTime"),
            "qdt:DateTimeString",
            f"{fi.corrects.issued_at:%Y%m%d}",
            format="102",
        )
    else:
        _el(totals, "ram:TotalPrepaidAmount", _money(fi.total_gross))  # paid on chain before the invoice
        _el(totals, "ram:DuePayableAmount", "0.00")
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8", pretty_print=True)


def check_facturx_xml(xml: bytes) -> None:
    """Raise unless the XML is valid against the EN 16931 (Factur-X) schema shipped with the factur-x library."""
    import facturx

    facturx.xml_check_xsd(xml, flavor="factur-x", level=FACTURX_LEVEL)


def _html(fiscal_invoice: FiscalInvoice) -> str:
    answers = [html for _receiver, html in document_html.send(sender=FiscalInvoice, invoice=fiscal_invoice)]
    if len(answers) != 1:
        raise ImproperlyConfigured("one receiver of payments.fiscal_documents.document_html must draw the invoice")
    return answers[0]


def fiscal_invoice_pdf(fiscal_invoice: FiscalInvoice) -> bytes:
    """The PDF/A-3b of the invoice with its Factur-X XML embedded (checked against the schema first)."""
    import facturx
    from weasyprint import HTML
    from weasyprint.urls import URLFetcher

    xml = facturx_xml(fiscal_invoice)
    check_facturx_xml(xml)
    # The page is self-contained: printing reads no file and no address (no protocol allowed), whatever text
    # reached the page.
    fetch_nothing = URLFetcher(allowed_protocols=frozenset())
    printed = HTML(string=_html(fiscal_invoice), url_fetcher=fetch_nothing).write_pdf(pdf_variant="pdf/a-3b")
    seller = fiscal_invoice.seller["name"]
    kind = "credit note" if fiscal_invoice.is_credit_note else "invoice"
    return facturx.generate_from_binary(
        printed,
        xml,
        flavor="factur-x",
        level=FACTURX_LEVEL,
        check_xsd=False,  # checked above
        pdf_metadata={
            "author": seller,
            "keywords": "Factur-X, Invoice",
            "title": f"{seller}: {kind.capitalize()} {fiscal_invoice.number}",
            "subject": f"Factur-X {kind} {fiscal_invoice.number} dated "
            f"{fiscal_invoice.issued_at:%Y-%m-%d} issued by {seller}",
        },
        lang="fr-FR" if fiscal_invoice.language == "fr" else "en-GB",
    )


class DocumentNotPrintable(Exception):
    """The invoice's document cannot be printed, and printing it again would fail the same way (recorded as a
    `FiscalDocumentFailure`): the customer is shown a page saying so, the operator sees it in the admin."""

    def __init__(self, failure: FiscalDocumentFailure) -> None:
        super().__init__(f"fiscal invoice {failure.fiscal_invoice.number} cannot be printed: {failure.error}")
        self.failure = failure


# What a retry may cure: the disk, a font file, the database. Anything else is the invoice's own content (lxml's
# ValueError for a character XML cannot hold, factur-x's Exception for what the schema refuses, WeasyPrint's): the
# same figures fail the same way every time.
TRANSIENT_ERRORS = (OSError, DatabaseError, MemoryError)


def fiscal_invoice_write_document(*, fiscal_invoice: FiscalInvoice) -> FiscalInvoice:
    """Print the invoice once: the PDF and its hash are written by one UPDATE that only an invoice without a PDF
    matches, so two workers racing write one document and a written one is never replaced. An invoice that cannot
    be printed for good is recorded as such and raises DocumentNotPrintable, now and on every later call (until the
    operator deletes the record); a transient error is raised as it is, to be tried again."""
    if fiscal_invoice.pdf_sha256:
        return fiscal_invoice
    failure = FiscalDocumentFailure.objects.filter(fiscal_invoice=fiscal_invoice).first()
    if failure is not None:
        raise DocumentNotPrintable(failure)
    try:
        pdf = fiscal_invoice_pdf(fiscal_invoice)
    except TRANSIENT_ERRORS:
        raise
    except Exception as exc:
        logger.exception("fiscal invoice %s cannot be printed", fiscal_invoice.number)
        failure, _created = FiscalDocumentFailure.objects.get_or_create(
            fiscal_invoice=fiscal_invoice,
            defaults={"failed_at": timezone.now(), "error": f"{type(exc).__name__}: {exc}"[:2000]},
        )
        raise DocumentNotPrintable(failure) from exc
    written = FiscalInvoice.objects.filter(pk=fiscal_invoice.pk, pdf_sha256="").update(
        pdf=pdf, pdf_sha256=hashlib.sha256(pdf).hexdigest(), pdf_written_at=timezone.now()
    )
    if not written:
        logger.info("fiscal invoice %s was printed by another worker", fiscal_invoice.number)
    return FiscalInvoice.objects.select_related("order").get(pk=fiscal_invoice.pk)


def fiscal_invoice_mark_emailed(*, fiscal_invoice: FiscalInvoice) -> None:
    FiscalInvoice.objects.filter(pk=fiscal_invoice.pk, emailed_at__isnull=True).update(emailed_at=timezone.now())


def document_intact(fiscal_invoice: FiscalInvoice) -> bool:
    """The stored PDF is the one issued: its bytes still have the hash written with them."""
    return bool(fiscal_invoice.pdf_sha256) and (
        hashlib.sha256(bytes(fiscal_invoice.pdf)).hexdigest() == fiscal_invoice.pdf_sha256
    )


# Printing and mailing are done by a task queued on commit; a worker that stopped in between leaves the invoice
# without its PDF or its e-mail, and beat's sweep queues it again after this long.
DOCUMENT_GRACE = timedelta(minutes=5)


def fiscal_invoices_without_document(*, now, limit: int = 20) -> list[int]:
    """Issued invoices whose PDF was not written or not e-mailed in time, but for those that cannot be printed: a
    capped batch, safe to queue twice (printing is once by construction; a second e-mail is the worst case)."""
    return list(
        FiscalInvoice.objects.filter(issued_at__lt=now - DOCUMENT_GRACE)
        .filter(Q(pdf_sha256="") | Q(emailed_at__isnull=True))
        .filter(document_failure__isnull=True)  # printing it again fails again: it would hold a place for ever
        .order_by("issued_at")
        .values_list("pk", flat=True)[:limit]
    )
