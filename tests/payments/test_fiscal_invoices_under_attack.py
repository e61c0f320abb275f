"""Attacks on the fiscal invoices (issue 21's red team, money after the payment): numbers that follow their issue
dates, billing details the invoice's XML cannot hold, an invoice that cannot be printed. Each test states the
behaviour the product promises; its docstring says HELD, or VULNERABILITY while the hole was open."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from booking.models import Order
from booking.rules import BookingError
from payments import scanner
from payments.demo import pay_invoice
from payments.models import FiscalInvoice
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from tests.builders.orders import place
from tests.builders.refunds import CHAIN_ID

pytestmark = pytest.mark.django_db


# --- 6. fiscal numbering follows the issue dates -------------------------------------------------------------------


@pytest.mark.usefixtures("full_refund_rules")
def test_invoice_numbers_follow_their_issue_dates(client, chain, booking_data, admin_user):
    """HELD (was a low, fiscal finding: numbers out of date order): the issue date is read when the number is
    taken, under the counter's lock, not the caller's `now`. A scan cycle that read its clock at its start and
    settles after an admin's "mark paid" during the cycle still dates its invoice after the admin's: French
    invoices are numbered in chronological order (CGI art. 242 nonies A), and the number's year is its date's."""
    scanned, _token = place(client, booking_data(lots="1", contact_email="scan@example.org"))
    marked, _token2 = place(client, booking_data(lots="1", contact_email="mark@example.org"))
    cycle_started = timezone.now()
    pay_invoice(chain, current_invoice(scanned))
    chain.mine(3)
    invoice_mark_paid(invoice=current_invoice(marked), user=admin_user, reason="paid by wire, during the cycle")
    scanner.chain_scan(chain_id=CHAIN_ID, now=cycle_started)  # the cycle that began before the admin's click

    issued = list(FiscalInvoice.objects.order_by("year", "sequence").values_list("number", "issued_at"))
    assert len(issued) == 2
    dates = [issued_at for _number, issued_at in issued]
    assert dates == sorted(dates), f"numbers out of date order: {issued}"


# --- 10. billing details the invoice's XML cannot hold ---------------------------------------------------------------


NOT_PRINTABLE = "invisible or reserved characters (such as U+FFFE) that cannot be printed"


@pytest.mark.usefixtures("full_refund_rules")
def test_billing_details_accepted_at_booking_always_print_on_the_invoice(booking_data, admin_client):
    """HELD (was a medium finding: billing details the invoice's XML cannot hold): U+FFFE / U+FFFF, lone
    surrogates, the other noncharacters and C1 controls, which XML 1.0 (and lxml) refuse, are refused with a message
    in the user's language wherever details printed on an invoice are entered: the booking form, the order page's
    billing change, the service behind both, and the admin's invoicing settings (the seller's details)."""
    from django.test import Client

    from booking.billing import BillingDetails, billing_check
    from payments.models import InvoicingSettings

    client = Client(raise_request_exception=False)
    refused = client.post(reverse("customer:book"), booking_data(lots="1", organisation="Analytical Engines Lab\ufffe"))
    assert refused.status_code == 200 and NOT_PRINTABLE in refused.content.decode()
    assert not Order.objects.exists()
    client.cookies["django_language"] = "fr"
    in_french = client.post(reverse("customer:book"), booking_data(lots="1", billing_address="1 rue Babbage\uffff"))
    assert "caractères invisibles ou réservés" in in_french.content.decode()
    client.cookies["django_language"] = "en"

    order, token = place(client, booking_data(lots="1", organisation="Analytical Engines Lab"))
    change = {
        "organisation": "Analytical Engines Lab",
        "billing_address": "12 Difference Row\n\U0010fffe",
        "billing_country": "GB",
        "vat_number": "",
        "purchase_order": "",
    }
    page = client.post(
        reverse("customer:order-billing", kwargs={"public_id": order.public_id, "token": token}), change, follow=True
    )
    assert NOT_PRINTABLE in page.content.decode()
    order.refresh_from_db()
    assert "\U0010fffe" not in order.billing_address
    for unprintable in ("\ud800", "\ufdd0", "\x85"):
        with pytest.raises(BookingError) as refusal:
            billing_check(BillingDetails(organisation=f"La{unprintable}b", address="1 Main St", country="US"))
        assert refusal.value.field == "organisation"

    settings_url = reverse("admin:payments_invoicingsettings_change", args=[1])
    InvoicingSettings.current()  # the one row, made on first use
    seller = {
        "seller_name": "Binôme\ufffe",
        "seller_address": "1 rue de l'Exemple\n75001 Paris",
        "seller_country": "FR",
        "seller_vat_number": "FR40303265045",
        "seller_registration": "",
        "legal_mentions": "",
        "vat_rate_percent": "20.00",
        "number_prefix": "F",
    }
    admin_page = admin_client.post(settings_url, seller)
    assert admin_page.status_code == 200 and NOT_PRINTABLE in admin_page.content.decode()


@pytest.mark.usefixtures("full_refund_rules")
def test_an_invoice_that_cannot_be_printed_answers_a_page_and_never_starves_the_sweep(
    booking_data, admin_user, mailoutbox
):
    """HELD (the other half of that finding): an issued invoice whose document cannot be printed for good (here
    details stored before the check existed) is recorded as unprintable the first time it is tried, by the order
    page's download or by the task: the download answers a page that says so (not a 500), the task stops without
    retrying or mailing, and beat's sweep no longer queues it, so it never holds a place in the sweep's batch that
    another customer's unprinted invoice needs."""
    from django.test import Client

    from payments.fiscal_documents import fiscal_invoices_without_document
    from payments.models import FiscalDocumentFailure
    from payments.tasks import issue_fiscal_document

    client = Client(raise_request_exception=False)
    order, token = place(client, booking_data(lots="1", organisation="Analytical Engines Lab"))
    Order.objects.filter(pk=order.pk).update(organisation="Analytical Engines Lab\ufffe")  # stored before the check
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test: paid by wire")
    unprintable = FiscalInvoice.objects.get(order=order)
    other, _other_token = place(client, booking_data(lots="1", contact_email="ada@example.org"))
    invoice_mark_paid(invoice=current_invoice(other), user=admin_user, reason="test: paid by wire")
    printable = FiscalInvoice.objects.get(order=other)  # its first print was lost (no worker ran it)

    response = client.get(
        reverse(
            "customer:order-invoice-pdf",
            kwargs={"public_id": order.public_id, "token": token, "number": unprintable.number},
        )
    )
    assert response.status_code == 200, f"the invoice download answered {response.status_code}"
    assert f"Invoice {unprintable.number} cannot be printed" in response.content.decode()
    assert FiscalDocumentFailure.objects.filter(fiscal_invoice=unprintable).exists()
    assert issue_fiscal_document(unprintable.pk) == "not printable"
    assert not [message for message in mailoutbox if unprintable.number in message.subject]

    stuck = fiscal_invoices_without_document(now=timezone.now() + timedelta(hours=1), limit=1)
    assert stuck == [printable.pk]
