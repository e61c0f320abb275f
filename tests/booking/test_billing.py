"""Billing details at booking: what the invoice will be made out to, checked and kept as the tax offices write it."""

import pytest
from django.urls import reverse

from booking.billing import BillingDetails, billing_check
from booking.models import Order
from booking.rules import BookingError

pytestmark = pytest.mark.django_db


def test_the_booking_keeps_the_billing_details_normalised(client, catalog, booking_data):
    response = client.post(
        reverse("customer:book"),
        booking_data(
            organisation="  Institut Pasteur ",
            billing_address="  25 rue du Docteur Roux\r\n\r\n75015 Paris  ",
            billing_country="fr",
            vat_number="fr 40 303.265.045",
            purchase_order="PO 2026/118",
        ),
    )

    assert response.status_code == 302
    order = Order.objects.get()
    assert order.organisation == "Institut Pasteur"
    assert order.billing_address == "25 rue du Docteur Roux\n75015 Paris"
    assert (order.billing_country, order.vat_number, order.purchase_order) == ("FR", "FR40303265045", "PO 2026/118")


@pytest.mark.parametrize(
    ("country", "vat_number", "kept"),
    [
        ("GR", "EL094259216", "EL094259216"),  # Greece writes EL
        ("NL", "NL004495445B01", "NL004495445B01"),
        ("CH", "CHE-123.456.788 MWST", "CHE123456788MWST"),  # outside the EU: bounded, not checked
        ("US", "", ""),
    ],
)
def test_vat_numbers_as_each_country_writes_them(country, vat_number, kept):
    details = BillingDetails(organisation="Lab", address="1 Main St", country=country, vat_number=vat_number)

    assert billing_check(details).vat_number == kept


def test_a_greek_number_written_with_the_iso_code_is_refused_with_the_prefix_to_use():
    details = BillingDetails(organisation="Lab", address="Odos 1", country="GR", vat_number="GR094259216")

    with pytest.raises(BookingError) as refused:
        billing_check(details)

    assert refused.value.field == "vat_number"
    assert "EL" in refused.value.message
