"""Invoices a lab can file: a settled payment issues a numbered invoice (gapless per year, even under concurrency),
printed once as PDF/A-3 with its EN 16931 XML (Factur-X), e-mailed and downloadable from the order page, with the
VAT treatment its buyer's details call for."""

import hashlib
import html
import io
import threading
from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace

import facturx
import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from lxml import etree
from pypdf import PdfReader

from booking.models import Order, OrderStatus
from payments import fiscal_documents, scanner
from payments.demo import pay_invoice
from payments.fiscal_models import FiscalInvoicePublished
from payments.models import FiscalDocumentFailure, FiscalInvoice, Invoice
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from tests.builders.orders import place
from tests.builders.payments import pdf_text
from tests.factories import add_lots
from tests.payments.schematron import RulesReport, en16931_rules

CII = {"ram": "urn:un:unece:uncefact:data:standard:ReusableAggregateBusinessInformationEntity:100"}


def xmp(pdf: bytes) -> bytes:
    return PdfReader(io.BytesIO(pdf)).trailer["/Root"]["/Metadata"].get_object().get_data()


def embedded_xml(pdf: bytes) -> bytes:
    filename, xml = facturx.get_facturx_xml_from_pdf(io.BytesIO(pdf), check_xsd=False)
    assert filename == "factur-x.xml"
    return xml


def assert_en16931(xml: bytes) -> RulesReport:
    """The XML is valid against the EN 16931 schema and breaks none of its business rules (the schematron)."""
    assert facturx.xml_check_xsd(xml, flavor="factur-x", level="en16931")
    report = en16931_rules(xml)
    assert all(report.fired.values()) and report.fatal == []
    return report


def invoice_url(order: Order, token: str, number: str) -> str:
    return reverse(
        "customer:order-invoice-pdf", kwargs={"public_id": order.public_id, "token": token, "number": number}
    )


def mark_paid(invoice: Invoice, *, execute_on_commit) -> None:
    admin = get_user_model().objects.get_or_create(username="operator", defaults={"is_staff": True})[0]
    with execute_on_commit(execute=True):
        invoice_mark_paid(invoice=invoice, user=admin, reason="paid by bank transfer")


def test_a_payment_confirmed_on_chain_issues_an_invoice_a_lab_can_file(
    client, chain, booking_data, django_capture_on_commit_callbacks
):
    # given: a French lab books two lots and pays on chain
    order, _token = place(
        client,
        booking_data(lots="2", purchase_order="PO-2026-118", vat_number="FR40303265045", billing_country="FR"),
    )
    invoice = current_invoice(order)
    tx_hash = pay_invoice(chain, invoice)
    chain.mine(3)

    # when: the scan confirms it
    with django_capture_on_commit_callbacks(execute=True):
        assert scanner.chain_scan(chain_id=31337).settled == [invoice.pk]

    # then: one invoice, numbered, with the payment as the chain showed it
    fiscal_invoice = FiscalInvoice.objects.get()
    year = timezone.now().year
    assert fiscal_invoice.number == f"F-{year}-000001"
    assert fiscal_invoice.payment_tx_hashes == [tx_hash]
    assert (fiscal_invoice.payment_asset, fiscal_invoice.payment_amount) == ("dEURC", "6300")
    assert fiscal_invoice.total_gross == order.total_price == Decimal("6300.00")
    # VAT included at 20 % for a buyer in the seller's country, and EN 16931's rounding holds
    assert fiscal_invoice.vat_category == "S"
    assert fiscal_invoice.total_net + fiscal_invoice.vat_amount == fiscal_invoice.total_gross
    assert fiscal_invoice.vat_amount == (fiscal_invoice.total_net * Decimal("0.20")).quantize(Decimal("0.01"))

    # the stored PDF is the one hashed, it opens, names the number, and carries XML valid against EN 16931
    pdf = bytes(fiscal_invoice.pdf)
    assert hashlib.sha256(pdf).hexdigest() == fiscal_invoice.pdf_sha256
    text = pdf_text(pdf)
    assert fiscal_invoice.number in text and "Analytical Engines Lab" in text and "PO-2026-118" in text
    assert tx_hash in text.replace("\n", "")
    xml = embedded_xml(pdf)
    assert_en16931(xml)
    tree = etree.fromstring(xml)
    assert tree.findtext(".//ram:BuyerTradeParty/ram:Name", namespaces=CII) == "Analytical Engines Lab"
    assert tree.findtext(".//ram:GrandTotalAmount", namespaces=CII) == "6300.00"
    assert tree.findtext(".//ram:DuePayableAmount", namespaces=CII) == "0.00"
    assert b"<pdfaid:part>3</pdfaid:part>" in xmp(pdf)  # it says it is a PDF/A-3 (its XMP metadata)

    # and it went to the contact as an attachment
    sent = [message for message in mail.outbox if fiscal_invoice.number in message.subject]
    assert len(sent) == 1 and sent[0].to == ["ada@example.org"]
    assert sent[0].attachments == [(f"invoice-{fiscal_invoice.number}.pdf", pdf, "application/pdf")]


def test_an_eu_business_of_another_member_state_is_invoiced_under_reverse_charge(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    order, _token = place(
        client,
        booking_data(
            billing_country="DE", vat_number="DE 136 695 976", billing_address="Unter den Linden 1\n10117 Berlin"
        ),
    )

    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)

    fiscal_invoice = FiscalInvoice.objects.get()
    assert (fiscal_invoice.vat_category, fiscal_invoice.vat_amount) == ("AE", Decimal("0.00"))
    assert fiscal_invoice.total_net == fiscal_invoice.total_gross == order.total_price
    text = pdf_text(bytes(fiscal_invoice.pdf))
    assert "Autoliquidation" in text and "DE136695976" in text
    xml = embedded_xml(bytes(fiscal_invoice.pdf))
    assert_en16931(xml)
    tree = etree.fromstring(xml)
    assert (
        tree.findtext(".//ram:ApplicableHeaderTradeSettlement/ram:ApplicableTradeTax/ram:CategoryCode", namespaces=CII)
        == "AE"
    )
    assert "Autoliquidation" in tree.findtext(".//ram:ExemptionReason", namespaces=CII)
    # the line says it too, as the VAT breakdown it adds up to (Factur-X BR-FXEXT-AE-08)
    line_tax = tree.find(".//ram:SpecifiedLineTradeSettlement/ram:ApplicableTradeTax", namespaces=CII)
    assert line_tax.findtext("ram:ExemptionReasonCode", namespaces=CII) == "VATEX-EU-AE"


@pytest.mark.parametrize(
    ("country", "vat_number", "category", "mention"),
    [
        ("US", "", "G", "outside the European Union"),
        ("DE", "", "S", None),  # an EU buyer without a VAT number pays VAT
        ("FR", "FR40303265045", "S", None),  # a buyer in the seller's own country pays VAT
    ],
)
def test_the_vat_treatment_follows_the_buyers_country_and_vat_number(
    client, catalog, booking_data, django_capture_on_commit_callbacks, country, vat_number, category, mention
):
    order, _token = place(client, booking_data(billing_country=country, vat_number=vat_number))

    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)

    fiscal_invoice = FiscalInvoice.objects.get()
    assert fiscal_invoice.vat_category == category
    assert (fiscal_invoice.vat_amount > 0) == (category == "S")
    text = pdf_text(bytes(fiscal_invoice.pdf))
    if mention:
        assert mention in text.replace("\n", " ")
    else:
        assert "Autoliquidation" not in text
    assert_en16931(embedded_xml(bytes(fiscal_invoice.pdf)))


def test_an_issued_invoice_is_downloaded_from_the_order_page_and_only_with_its_link(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    order, token = place(client, booking_data())
    other, other_token = place(Client(REMOTE_ADDR="10.9.9.9"), booking_data(contact_email="bob@example.org"))
    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)
    fiscal_invoice = FiscalInvoice.objects.get()

    page = html.unescape(
        client.get(reverse("customer:order", kwargs={"public_id": order.public_id, "token": token})).content.decode()
    )
    assert invoice_url(order, token, fiscal_invoice.number) in page

    response = client.get(invoice_url(order, token, fiscal_invoice.number))
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    assert response.content == bytes(fiscal_invoice.pdf)
    assert f'filename="invoice-{fiscal_invoice.number}.pdf"' in response["Content-Disposition"]
    assert response["Referrer-Policy"] == "same-origin"

    # an attacker: a wrong token, and another order's link asking for this invoice's number
    assert client.get(invoice_url(order, "x" * len(token), fiscal_invoice.number)).status_code == 404
    assert client.get(invoice_url(other, other_token, fiscal_invoice.number)).status_code == 404
    assert client.get(invoice_url(order, token, "F-1999-000001")).status_code == 404


def test_the_pdf_is_printed_once_and_never_regenerated(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    order, token = place(client, booking_data())
    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)
    fiscal_invoice = FiscalInvoice.objects.get()
    written = (bytes(fiscal_invoice.pdf), fiscal_invoice.pdf_sha256, fiscal_invoice.pdf_written_at)

    # the operator edits the seller's details afterwards; the issued document stays as it was
    from payments.models import InvoicingSettings

    InvoicingSettings.objects.filter(pk=1).update(seller_name="Renamed SAS")
    again = fiscal_documents.fiscal_invoice_write_document(fiscal_invoice=FiscalInvoice.objects.get())
    assert (bytes(again.pdf), again.pdf_sha256, again.pdf_written_at) == written
    assert client.get(invoice_url(order, token, fiscal_invoice.number)).content == written[0]
    with pytest.raises(FiscalInvoicePublished):
        again.save()
    with pytest.raises(FiscalInvoicePublished):
        again.delete()
    # and behind the model, PostgreSQL itself: code that writes the row directly is refused too
    for change in (
        lambda rows: rows.update(total_gross=Decimal("1.00"), total_net=Decimal("1.00"), vat_amount=0),
        lambda rows: rows.update(buyer={"organisation": "Someone else"}),
        lambda rows: rows.update(pdf=b"%PDF-forged", pdf_sha256=hashlib.sha256(b"%PDF-forged").hexdigest()),
        lambda rows: rows._raw_delete(rows.db),
    ):
        with pytest.raises(DatabaseError, match="fiscal invoice"), transaction.atomic():
            change(FiscalInvoice.objects.filter(pk=again.pk))
    assert bytes(FiscalInvoice.objects.get().pdf) == written[0]


def test_billing_details_change_until_the_invoice_is_issued_then_are_refused(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    order, token = place(client, booking_data())
    url = reverse("customer:order-billing", kwargs={"public_id": order.public_id, "token": token})
    new_details = {
        "organisation": "Institut Pasteur",
        "billing_address": "25 rue du Docteur Roux\n75015 Paris",
        "billing_country": "FR",
        "vat_number": "",
        "purchase_order": "PO 7",
    }

    # before the payment: saved, and what the invoice is then made out to
    page = client.post(url, new_details, follow=True).content.decode()
    assert "Billing details saved." in html.unescape(page)
    order.refresh_from_db()
    assert (order.organisation, order.purchase_order) == ("Institut Pasteur", "PO 7")

    # hostile input: a clear message, nothing changed
    for field, value, message in [
        ("billing_country", "XX", "Give the country as its two-letter ISO code"),
        ("vat_number", "FR40303265046", "This is not a valid VAT number of FR"),
        ("billing_address", "<script>alert(1)</script>", "HTML tags are not accepted here."),
        ("organisation", "Lab\r\nBcc: victim@example.org", "Write this on one line."),
    ]:
        page = html.unescape(client.post(url, {**new_details, field: value}, follow=True).content.decode())
        assert message in page, field
        assert "<script>alert(1)" not in page
    order.refresh_from_db()
    assert order.organisation == "Institut Pasteur" and order.billing_country == "FR"

    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)
    assert FiscalInvoice.objects.get().buyer["organisation"] == "Institut Pasteur"

    # after the invoice: refused with a clear message, and the form is gone from the page
    page = html.unescape(client.post(url, {**new_details, "organisation": "Other Lab"}, follow=True).content.decode())
    assert "The invoice of this order is already issued: its billing details can no longer change." in page
    assert 'action="' + url + '"' not in page
    order.refresh_from_db()
    assert order.organisation == "Institut Pasteur"


@pytest.mark.django_db(transaction=True)
def test_fifty_settlements_at_once_take_fifty_consecutive_numbers(catalog, booking_data, settings):
    # given: fifty researchers with an unpaid order each
    settings.RATELIMIT_ENABLE = False
    add_lots(catalog["b200-pair"], 50)
    for index in range(50):
        client = Client(REMOTE_ADDR=f"10.0.{index // 200}.{index % 200 + 1}")
        assert (
            client.post(
                reverse("customer:book"), booking_data(lots="1", contact_email=f"r{index}@example.org")
            ).status_code
            == 302
        )
    invoices = list(Invoice.objects.filter(status=Invoice.Status.NEW))
    assert len(invoices) == 50
    admin = get_user_model().objects.create(username="operator", is_staff=True)
    barrier = threading.Barrier(50)
    errors: list[BaseException] = []

    def settle(invoice: Invoice) -> None:
        try:
            barrier.wait(timeout=60)
            invoice_mark_paid(invoice=invoice, user=admin, reason="paid by bank transfer")
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    # when: all fifty are settled at the same moment
    threads = [threading.Thread(target=settle, args=(invoice,)) for invoice in invoices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)

    # then: fifty invoices numbered 1 to 50 of the year, no gap, no duplicate, one per payment
    assert errors == []
    year = timezone.now().year
    issued = list(FiscalInvoice.objects.values_list("year", "sequence", "number", "payment_id"))
    assert sorted(sequence for _year, sequence, _number, _payment in issued) == list(range(1, 51))
    assert {number for *_rest, number, _payment in issued} == {f"F-{year}-{n:06d}" for n in range(1, 51)}
    assert sorted(payment for *_rest, payment in issued) == sorted(invoice.pk for invoice in invoices)
    assert Order.objects.filter(status=OrderStatus.PAID).count() == 50
    assert not FiscalInvoice.objects.filter(pdf_sha256="").exists()  # each printed once its settlement committed


def test_an_invoice_left_unprinted_by_a_stopped_worker_is_printed_and_mailed_by_beats_sweep(
    client, catalog, booking_data, monkeypatch
):
    from payments import tasks
    from payments.tasks import print_fiscal_documents

    # given: settled, but the worker stopped before the task that prints it ran (no on-commit callbacks here)
    order, _token = place(client, booking_data())
    invoice_mark_paid(invoice=current_invoice(order), user=get_user_model().objects.create(username="op"), reason="x")
    fiscal_invoice = FiscalInvoice.objects.get()
    assert fiscal_invoice.pdf_sha256 == "" and not [m for m in mail.outbox if fiscal_invoice.number in m.subject]
    assert print_fiscal_documents() == 0  # not before its grace period

    # when: beat's sweep runs later
    later = timezone.now() + timedelta(minutes=6)
    monkeypatch.setattr(tasks, "timezone", SimpleNamespace(now=lambda: later))
    assert print_fiscal_documents() == 1

    # then: printed and mailed once; the next sweep finds nothing
    fiscal_invoice.refresh_from_db()
    assert fiscal_invoice.pdf_sha256 and fiscal_invoice.emailed_at
    assert len([m for m in mail.outbox if fiscal_invoice.number in m.subject]) == 1
    assert print_fiscal_documents() == 0


def test_the_operator_reads_issued_invoices_in_the_admin_but_cannot_change_them(
    admin_client, client, catalog, booking_data, django_capture_on_commit_callbacks
):
    order, _token = place(client, booking_data())
    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)
    fiscal_invoice = FiscalInvoice.objects.get()

    listing = admin_client.get(reverse("admin:payments_fiscalinvoice_changelist"))
    assert listing.status_code == 200 and fiscal_invoice.number in listing.content.decode()
    pdf = admin_client.get(reverse("admin:payments_fiscalinvoice_pdf", args=[fiscal_invoice.pk]))
    assert pdf.status_code == 200 and pdf.content == bytes(fiscal_invoice.pdf)
    change = admin_client.post(
        reverse("admin:payments_fiscalinvoice_change", args=[fiscal_invoice.pk]), {"number": "F-0000-000001"}
    )
    assert change.status_code == 403
    assert FiscalInvoice.objects.get().number == fiscal_invoice.number
    settings_page = admin_client.get(reverse("admin:payments_invoicingsettings_change", args=[1]))
    assert settings_page.status_code == 200 and "VAT rate" in settings_page.content.decode()


def test_an_extension_paid_later_gets_the_next_number_and_its_own_line(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    from booking.services import order_transition
    from payments.checkout import order_extension_request

    order, _token = place(client, booking_data(lots="2"))
    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    extension = order_extension_request(order=order, days=3, actor=None)

    mark_paid(extension, execute_on_commit=django_capture_on_commit_callbacks)

    first, second = FiscalInvoice.objects.order_by("sequence")
    assert (first.sequence, second.sequence) == (1, 2) and second.payment == extension
    assert second.total_gross == extension.fiat_amount
    assert second.lines[0]["quantity"] == 2 and second.lines[0]["days"] == 3
    assert f"extension of order {order.public_id} by 3 days" in second.lines[0]["description"]
    assert_en16931(embedded_xml(bytes(second.pdf)))


def test_a_french_order_gets_its_invoice_and_its_e_mail_in_french(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    from tests.builders.orders import place_in_french

    order, _token = place_in_french(client, booking_data(billing_country="BE", vat_number="BE0403019261"))

    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)

    fiscal_invoice = FiscalInvoice.objects.get()
    text = pdf_text(bytes(fiscal_invoice.pdf))
    assert f"Facture {fiscal_invoice.number}" in text and "Total TTC" in text
    assert "Autoliquidation : TVA due par le preneur" in text.replace("\n", " ")
    assert_en16931(embedded_xml(bytes(fiscal_invoice.pdf)))  # its mentions in French
    sent = next(message for message in mail.outbox if fiscal_invoice.number in message.subject)
    assert sent.subject == f"Facture {fiscal_invoice.number} de votre commande Binôme {order.public_id}"
    assert "Vous trouverez ci-jointe la facture" in sent.body


def test_a_paid_order_cancelled_for_a_refund_gets_a_credit_note_naming_its_invoice(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    from booking.cancellation import refund_quote
    from booking.services import order_cancel_by_customer

    order, token = place(client, booking_data(lots="2", billing_country="DE", vat_number="DE136695976"))
    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)
    invoice = FiscalInvoice.objects.get()
    order.refresh_from_db()
    refund = refund_quote(order=order, now=timezone.now()).amount
    assert 0 < refund <= invoice.total_gross

    with django_capture_on_commit_callbacks(execute=True):
        order_cancel_by_customer(order=order, refund_shown=refund)

    note = FiscalInvoice.objects.get(kind=FiscalInvoice.Kind.CREDIT_NOTE)
    assert (note.corrects, note.total_gross, note.sequence) == (invoice, refund, invoice.sequence + 1)
    assert (note.vat_category, note.buyer) == ("AE", invoice.buyer)  # the same treatment as what it corrects
    pdf = bytes(note.pdf)
    text = pdf_text(pdf)
    assert f"Credit note {note.number}" in text and f"Corrects invoice {invoice.number}" in text
    xml = embedded_xml(pdf)
    assert_en16931(xml)
    tree = etree.fromstring(xml)
    assert tree.findtext(".//{*}ExchangedDocument/{*}TypeCode") == "381"
    assert tree.findtext(".//ram:InvoiceReferencedDocument/ram:IssuerAssignedID", namespaces=CII) == invoice.number
    assert tree.findtext(".//ram:DuePayableAmount", namespaces=CII) == f"{refund:.2f}"
    # an amount is due to the buyer: the payment terms say how (EN 16931 BR-CO-25)
    terms = tree.findtext(".//ram:SpecifiedTradePaymentTerms/ram:Description", namespaces=CII)
    assert terms.startswith("Refunded on chain 31337 in dEURC") and invoice.number in terms
    sent = next(message for message in mail.outbox if note.number in message.subject)
    assert sent.subject.startswith("Credit note") and sent.attachments[0][0] == f"credit-note-{note.number}.pdf"
    page = html.unescape(
        client.get(reverse("customer:order", kwargs={"public_id": order.public_id, "token": token})).content.decode()
    )
    assert f"Credit note {note.number}" in page and invoice_url(order, token, note.number) in page
    assert client.get(invoice_url(order, token, note.number)).content == pdf


def test_a_rejected_order_is_credited_in_full_once(client, catalog, booking_data, django_capture_on_commit_callbacks):
    from payments.fiscal import fiscal_credit_notes_for_refund
    from provisioning.services import order_reject

    order, _token = place(client, booking_data())
    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)
    invoice = FiscalInvoice.objects.get()
    operator = get_user_model().objects.get(username="operator")

    with django_capture_on_commit_callbacks(execute=True):
        order_reject(order=order, actor=operator, reason="No export licence for this destination.")

    note = FiscalInvoice.objects.get(kind=FiscalInvoice.Kind.CREDIT_NOTE)
    assert note.corrects == invoice and note.total_gross == invoice.total_gross
    assert (note.total_net, note.vat_amount) == (invoice.total_net, invoice.vat_amount)
    assert fiscal_credit_notes_for_refund(order_id=order.pk) == []  # a reaction run twice credits nothing more
    assert FiscalInvoice.objects.count() == 2


def test_printing_reads_no_file_and_no_address_even_when_the_page_asks(
    client, catalog, booking_data, django_capture_on_commit_callbacks, tmp_path
):
    from web.invoice_document import fiscal_invoice_html

    secret = tmp_path / "secret.css"
    secret.write_text("body::after { content: 'LEAKED-FROM-DISK' }")
    order, _token = place(client, booking_data())
    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)
    fiscal_invoice = FiscalInvoice.objects.get()

    def hostile_page(sender, *, invoice, **kwargs) -> str:
        return f'<html><head><link rel="stylesheet" href="file://{secret}"></head><body>{invoice.number}</body></html>'

    fiscal_documents.document_html.disconnect(dispatch_uid="web-fiscal-invoice")
    fiscal_documents.document_html.connect(hostile_page, dispatch_uid="test-hostile-page")
    try:
        text = pdf_text(fiscal_documents.fiscal_invoice_pdf(fiscal_invoice))
    finally:
        fiscal_documents.document_html.disconnect(dispatch_uid="test-hostile-page")
        fiscal_documents.document_html.connect(fiscal_invoice_html, dispatch_uid="web-fiscal-invoice")

    assert fiscal_invoice.number in text and "LEAKED-FROM-DISK" not in text


def test_an_invoice_download_during_a_disk_error_says_to_try_again_and_records_no_failure(
    client, catalog, booking_data, monkeypatch
):
    import weasyprint

    from payments.models import FiscalDocumentFailure

    # given: an issued invoice, not printed yet, and a disk that refuses writes for a moment
    order, token = place(client, booking_data())
    invoice_mark_paid(invoice=current_invoice(order), user=get_user_model().objects.create(username="op"), reason="x")
    fiscal_invoice = FiscalInvoice.objects.get()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(weasyprint.HTML, "write_pdf", disk_full)
    url = reverse(
        "customer:order-invoice-pdf",
        kwargs={"public_id": order.public_id, "token": token, "number": fiscal_invoice.number},
    )

    # when: the customer downloads it
    response = Client(raise_request_exception=False).get(url)

    # then: a page says to try again; nothing marks it unprintable, so the sweep still prints it
    assert response.status_code == 503 and "download it again in a minute" in response.content.decode()
    assert not FiscalDocumentFailure.objects.exists()
    assert fiscal_documents.fiscal_invoices_without_document(now=timezone.now() + timedelta(hours=1)) == [
        fiscal_invoice.pk
    ]


# The documents the portal prints, each built as a customer and an operator make it, for the EN 16931 rules.
def _booking_invoice(client, booking_data, on_commit) -> FiscalInvoice:
    order, _token = place(client, booking_data(lots="2", purchase_order="PO-2026-118"))
    mark_paid(current_invoice(order), execute_on_commit=on_commit)
    return FiscalInvoice.objects.get()


def _extension_invoice(client, booking_data, on_commit) -> FiscalInvoice:
    from booking.services import order_transition
    from payments.checkout import order_extension_request

    order, _token = place(client, booking_data(lots="2"))
    mark_paid(current_invoice(order), execute_on_commit=on_commit)
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    mark_paid(order_extension_request(order=order, days=3, actor=None), execute_on_commit=on_commit)
    return FiscalInvoice.objects.get(payment__purpose=Invoice.Purpose.EXTENSION)


def _reverse_charge_invoice(client, booking_data, on_commit) -> FiscalInvoice:
    order, _token = place(client, booking_data(billing_country="DE", vat_number="DE136695976"))
    mark_paid(current_invoice(order), execute_on_commit=on_commit)
    return FiscalInvoice.objects.get()


def _outside_eu_invoice(client, booking_data, on_commit) -> FiscalInvoice:
    order, _token = place(client, booking_data(billing_country="US"))
    mark_paid(current_invoice(order), execute_on_commit=on_commit)
    return FiscalInvoice.objects.get()


def _cancellation_credit_note(client, booking_data, on_commit, **billing) -> FiscalInvoice:
    """What the cancellation policy refunds, credited (all of it, a week before the start)."""
    from booking.cancellation import refund_quote
    from booking.services import order_cancel_by_customer

    order, _token = place(client, booking_data(lots="2", **billing))
    mark_paid(current_invoice(order), execute_on_commit=on_commit)
    order.refresh_from_db()
    with on_commit(execute=True):
        order_cancel_by_customer(order=order, refund_shown=refund_quote(order=order, now=timezone.now()).amount)
    return FiscalInvoice.objects.get(kind=FiscalInvoice.Kind.CREDIT_NOTE)


def _reverse_charge_credit_note(client, booking_data, on_commit) -> FiscalInvoice:
    return _cancellation_credit_note(client, booking_data, on_commit, billing_country="DE", vat_number="DE136695976")


def _rejection_credit_note(client, booking_data, on_commit) -> FiscalInvoice:
    """The whole price credited, the order refused by the operator."""
    from provisioning.services import order_reject

    order, _token = place(client, booking_data())
    mark_paid(current_invoice(order), execute_on_commit=on_commit)
    with on_commit(execute=True):
        order_reject(order=order, actor=get_user_model().objects.get(username="operator"), reason="No licence.")
    return FiscalInvoice.objects.get(kind=FiscalInvoice.Kind.CREDIT_NOTE)


def _provider_fault_credit_note(client, booking_data, on_commit) -> FiscalInvoice:
    """A part of the price credited: 11 hours lost on one of two lots of 7 days, 206.25 of 6,300.00."""
    from payments.refunds import refund_for_lost_time

    invoice = _booking_invoice(client, booking_data, on_commit)
    with on_commit(execute=True):
        refund_for_lost_time(order=invoice.order, lost=timedelta(hours=11), lots=1)
    note = FiscalInvoice.objects.get(kind=FiscalInvoice.Kind.CREDIT_NOTE)
    assert note.total_gross == Decimal("206.25")
    return note


def _last_credit_note(client, booking_data, on_commit) -> FiscalInvoice:
    """The second of two credit notes, which credits what the first left (the order then withdrawn)."""
    from payments.fiscal import fiscal_credit_note_issue

    invoice = _provider_fault_credit_note(client, booking_data, on_commit).corrects
    with on_commit(execute=True):
        return fiscal_credit_note_issue(invoice=invoice, amount=invoice.total_gross, reason="order withdrawn")


DOCUMENTS = {
    "booking invoice": _booking_invoice,
    "extension invoice": _extension_invoice,
    "reverse-charge invoice": _reverse_charge_invoice,
    "outside-EU invoice": _outside_eu_invoice,
    "cancellation credit note": _cancellation_credit_note,
    "reverse-charge credit note": _reverse_charge_credit_note,
    "rejection credit note": _rejection_credit_note,
    "provider-fault credit note": _provider_fault_credit_note,
    "last of two credit notes": _last_credit_note,
}


@pytest.mark.parametrize("kind", DOCUMENTS)
def test_every_kind_of_document_keeps_the_en16931_business_rules(
    client, catalog, booking_data, django_capture_on_commit_callbacks, kind
):
    # given: the document as the portal issued and printed it
    document = DOCUMENTS[kind](client, booking_data, django_capture_on_commit_callbacks)
    document.refresh_from_db()
    assert not FiscalDocumentFailure.objects.exists()
    xml = embedded_xml(bytes(document.pdf))

    # when: the EN 16931 schematron (CEN rules, with Factur-X's for the profile) runs on its XML
    report = assert_en16931(xml)

    # then: no rule fails (assert_en16931), and the rules that read totals and VAT breakdowns did run
    print(f"{kind}: {report.fired} rules fired, {len(report.fatal)} fatal, warnings {report.warnings}")
    assert min(report.fired.values()) >= 50
    assert etree.fromstring(xml).findtext(".//ram:GrandTotalAmount", namespaces=CII) == f"{document.total_gross:.2f}"


@pytest.mark.parametrize("kind", ["booking invoice", "rejection credit note"])
def test_a_total_changed_by_one_euro_breaks_the_rules_that_add_totals_up(
    client, catalog, booking_data, django_capture_on_commit_callbacks, kind
):
    # given: a printed document that keeps the rules
    document = DOCUMENTS[kind](client, booking_data, django_capture_on_commit_callbacks)
    document.refresh_from_db()
    tree = etree.fromstring(embedded_xml(bytes(document.pdf)))
    assert en16931_rules(etree.tostring(tree)).fatal == []

    # when: its total with VAT says 1.00 more than its lines and its VAT
    grand_total = tree.find(".//ram:GrandTotalAmount", namespaces=CII)
    grand_total.text = f"{Decimal(grand_total.text) + 1:.2f}"
    report = en16931_rules(etree.tostring(tree))

    # then: total = net + VAT (BR-CO-15, and the French set's own copy of it) and due = total - paid (BR-CO-16)
    # fail, and nothing else
    assert report.fatal_ids == {"BR-CO-15", "BR-CO-16", "BR-FREXT-CO-15"}


def test_credit_notes_that_credit_a_whole_sale_net_to_zero_net_and_zero_vat(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    from payments.fiscal import fiscal_credit_note_issue, split_gross

    # given: an invoice of 6,300.00 (5,250.00 + 1,050.00 VAT), credited 206.25 for 11 hours lost on one lot, then in
    # full: split on its own, each note rounds its VAT its way, and together they would leave a cent on each side
    invoice = _booking_invoice(client, booking_data, django_capture_on_commit_callbacks)
    assert (invoice.total_net, invoice.vat_amount) == (Decimal("5250.00"), Decimal("1050.00"))
    alone = [split_gross(gross=gross, rate=invoice.vat_rate) for gross in (Decimal("206.25"), Decimal("6093.75"))]
    assert sum(net for net, _vat in alone) == Decimal("5250.01") and sum(vat for _net, vat in alone) == Decimal(
        "1049.99"
    )

    # when: the two credit notes are issued
    with django_capture_on_commit_callbacks(execute=True):
        first = fiscal_credit_note_issue(invoice=invoice, amount=Decimal("206.25"), reason="provider fault")
        last = fiscal_credit_note_issue(invoice=invoice, amount=Decimal("6093.75"), reason="order withdrawn")

    # then: what they credit is the invoice to the cent, net and VAT, and what is left after the first is the
    # invoice's own split of what is left (the first takes the cent, the VAT of the rest rounds as a price's)
    assert (first.total_net + last.total_net, first.vat_amount + last.vat_amount) == (
        invoice.total_net,
        invoice.vat_amount,
    )
    assert (first.total_gross, first.total_net, first.vat_amount) == (
        Decimal("206.25"),
        Decimal("171.87"),
        Decimal("34.38"),
    )
    assert (last.total_net, last.vat_amount) == split_gross(gross=Decimal("6093.75"), rate=invoice.vat_rate)
    # nothing is left to credit, and each note keeps the EN 16931 rules (its VAT within the rounding BR-CO-17 allows)
    assert fiscal_credit_note_issue(invoice=invoice, amount=Decimal("0.01"), reason="again") is None
    for note in (first, last):
        note.refresh_from_db()
        assert_en16931(embedded_xml(bytes(note.pdf)))


def test_three_credit_notes_of_an_odd_price_leave_nothing_and_never_credit_more_than_the_invoice(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    from payments.fiscal import fiscal_credit_note_issue

    # given: an invoice of 6,300.00 credited a cent, then 2,000.01, then more than what is left
    invoice = _booking_invoice(client, booking_data, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        notes = [
            fiscal_credit_note_issue(invoice=invoice, amount=amount, reason="credit")
            for amount in (Decimal("0.01"), Decimal("2000.01"), Decimal("9999.00"))
        ]

    # then: the last is capped to what was left, and the three add up to the invoice, net and VAT
    assert [note.total_gross for note in notes] == [Decimal("0.01"), Decimal("2000.01"), Decimal("4299.98")]
    for field in ("total_gross", "total_net", "vat_amount"):
        assert sum(getattr(note, field) for note in notes) == getattr(invoice, field), field
    assert all(note.total_net >= 0 and note.vat_amount >= 0 for note in notes)


def _settings_form(**changes) -> dict:
    from payments.fiscal_admin import SETTINGS_FIELDS
    from payments.models import InvoicingSettings

    current = InvoicingSettings.current()
    return {**{name: getattr(current, name) for name in SETTINGS_FIELDS}, **changes}


def test_a_new_prefix_starts_its_own_series_and_issued_documents_keep_their_prefix_and_vat(
    admin_client, client, catalog, booking_data, django_capture_on_commit_callbacks
):
    from provisioning.services import order_reject

    year = timezone.now().year
    settings_url = reverse("admin:payments_invoicingsettings_change", args=[1])
    # given: an order invoiced under F at 20 %
    first_order, _token = place(client, booking_data())
    mark_paid(current_invoice(first_order), execute_on_commit=django_capture_on_commit_callbacks)
    first = FiscalInvoice.objects.get()
    assert (first.number, first.vat_rate) == (f"F-{year}-000001", Decimal("20.00"))

    # when: mid-year, the operator sets the prefix BIN and a VAT rate of 21 %, and sales go on
    response = admin_client.post(settings_url, _settings_form(number_prefix="BIN", vat_rate_percent="21.00"))
    assert response.status_code == 302
    second_order, _token = place(Client(REMOTE_ADDR="10.9.9.9"), booking_data(contact_email="bob@example.org"))
    mark_paid(current_invoice(second_order), execute_on_commit=django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        order_reject(order=first_order, actor=get_user_model().objects.get(username="operator"), reason="No licence.")

    # then: BIN numbers from 1: the new sale at 21 %, and the credit note of the first sale at the rate it was sold at
    second = FiscalInvoice.objects.get(payment__order=second_order)
    note = FiscalInvoice.objects.get(kind=FiscalInvoice.Kind.CREDIT_NOTE)
    assert (second.number, second.prefix, second.vat_rate) == (f"BIN-{year}-000001", "BIN", Decimal("21.00"))
    assert second.vat_amount == (second.total_net * Decimal("0.21")).quantize(Decimal("0.01"))
    assert (note.number, note.corrects, note.vat_rate) == (f"BIN-{year}-000002", first, Decimal("20.00"))
    assert (note.total_net, note.vat_amount) == (first.total_net, first.vat_amount)
    # the first invoice is as it was issued, its document too
    first.refresh_from_db()
    assert (first.number, first.prefix, first.vat_rate) == (f"F-{year}-000001", "F", Decimal("20.00"))
    assert f"F-{year}-000001" in pdf_text(bytes(first.pdf))
    for document in (first, second, note):
        document.refresh_from_db()
        xml = embedded_xml(bytes(document.pdf))
        assert_en16931(xml)
        assert etree.fromstring(xml).findtext(".//{*}ExchangedDocument/{*}ID") == document.number

    # when: the operator goes back to F, its series continues where it stopped
    assert admin_client.post(settings_url, _settings_form(number_prefix="F")).status_code == 302
    third_order, _token = place(Client(REMOTE_ADDR="10.9.9.10"), booking_data(contact_email="eve@example.org"))
    mark_paid(current_invoice(third_order), execute_on_commit=django_capture_on_commit_callbacks)
    assert FiscalInvoice.objects.get(payment__order=third_order).number == f"F-{year}-000002"

    # and the operator reads when each prefix and rate was set, each series, and the invoices by prefix, in the admin
    history = html.unescape(
        admin_client.get(reverse("admin:payments_invoicingsettingschange_changelist")).content.decode()
    )
    assert "invoice number prefix: F → BIN; VAT rate (%): 20.00 → 21.00" in history
    assert "invoice number prefix: BIN → F" in history
    series = admin_client.get(reverse("admin:payments_fiscalinvoiceseries_changelist")).content.decode()
    assert f"F-{year}-000002" in series and f"BIN-{year}-000002" in series
    listing = admin_client.get(reverse("admin:payments_fiscalinvoice_changelist"), {"prefix": "BIN"})
    assert f"BIN-{year}-000001" in listing.content.decode() and f"F-{year}-000001" not in listing.content.decode()


@pytest.mark.django_db(transaction=True)
def test_settlements_racing_a_prefix_change_leave_each_prefix_a_gapless_series(catalog, booking_data, settings):
    from payments.models import InvoicingSettings

    # given: twenty unpaid orders, and an operator about to change the prefix
    settings.RATELIMIT_ENABLE = False
    add_lots(catalog["b200-pair"], 20)
    for index in range(20):
        client = Client(REMOTE_ADDR=f"10.1.0.{index + 1}")
        data = booking_data(lots="1", contact_email=f"r{index}@example.org")
        assert client.post(reverse("customer:book"), data).status_code == 302
    invoices = list(Invoice.objects.filter(status=Invoice.Status.NEW))
    admin = get_user_model().objects.create(username="operator", is_staff=True)
    InvoicingSettings.current()
    barrier = threading.Barrier(21)
    errors: list[BaseException] = []

    def run(action) -> None:
        try:
            barrier.wait(timeout=60)
            action()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    def settle(invoice: Invoice):
        return lambda: invoice_mark_paid(invoice=invoice, user=admin, reason="paid by bank transfer")

    def change_prefix():
        InvoicingSettings.objects.filter(pk=1).update(number_prefix="G")

    # when: the twenty settle while the prefix changes from F to G
    threads = [threading.Thread(target=run, args=(settle(invoice),)) for invoice in invoices]
    threads.append(threading.Thread(target=run, args=(change_prefix,)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)

    # then: whichever prefix each took, each prefix's numbers run from 1 without a gap, one invoice per payment
    assert errors == []
    year = timezone.now().year
    issued = list(FiscalInvoice.objects.values_list("prefix", "sequence", "number", "payment_id"))
    assert {prefix for prefix, *_rest in issued} <= {"F", "G"}
    for prefix in ("F", "G"):
        sequences = sorted(sequence for taken, sequence, *_rest in issued if taken == prefix)
        assert sequences == list(range(1, len(sequences) + 1)), prefix
    assert all(number == f"{prefix}-{year}-{sequence:06d}" for prefix, sequence, number, _payment in issued)
    assert sorted(payment for *_rest, payment in issued) == sorted(invoice.pk for invoice in invoices)
    assert InvoicingSettings.current().number_prefix == "G"


def test_the_operator_cannot_set_a_vat_rate_of_zero_that_would_break_every_invoice_after_it(
    admin_client, client, catalog, booking_data, django_capture_on_commit_callbacks
):
    from payments.models import InvoicingSettings

    # given: the settings page; a rate of 0 % would print category S ("VAT due") at 0 %, which EN 16931 refuses
    settings_url = reverse("admin:payments_invoicingsettings_change", args=[1])

    # when: the operator sets 0 %, then a reduced rate of 5.5 %
    refused = admin_client.post(settings_url, _settings_form(vat_rate_percent="0.00"))
    assert refused.status_code == 200
    assert "Invoices with VAT carry a rate above 0 %." in html.unescape(refused.content.decode())
    assert InvoicingSettings.current().vat_rate_percent == Decimal("20.00")
    assert admin_client.post(settings_url, _settings_form(vat_rate_percent="5.50")).status_code == 302

    # then: the next invoice is at 5.5 %, its VAT rounds as EN 16931 says, and it keeps the rules
    order, _token = place(client, booking_data())
    mark_paid(current_invoice(order), execute_on_commit=django_capture_on_commit_callbacks)
    invoice = FiscalInvoice.objects.get()
    assert (invoice.total_net, invoice.vat_amount, invoice.vat_rate) == (
        Decimal("5971.56"),
        Decimal("328.44"),
        Decimal("5.50"),
    )
    assert_en16931(embedded_xml(bytes(invoice.pdf)))
