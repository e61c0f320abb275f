"""The parts of an order's address and of an invoice number are parsed before any query (web/converters.py): a
malformed one, a NUL byte included, is a 404, never a server error mailed to the operators (issue 19's red team)."""

import warnings

import pytest
from django.core import mail
from django.core.cache.backends.base import CacheKeyWarning
from django.test import Client

from tests.builders.orders import place


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/orders/%00/x/",  # the order page
        "/orders/%00/x/events/",  # its event list
        "/orders/%00/x/readings.csv",
        "/orders/%00/x/book-again/",
    ],
)
def test_a_nul_byte_in_an_order_link_is_a_404_not_a_500_mailed_to_the_operators(settings, catalog, path):
    """An order address whose number or token holds a NUL byte (`/orders/%00/x/`), or any character an order
    number or token never has, is a 404 like any unknown order, with no e-mail to ADMINS: the URL converter
    (web/converters.py) refuses it before it reaches PostgreSQL, which refuses NUL in text (a `DataError`, a 500
    mailed to the operators for anyone's one GET). This holds where gunicorn is reached without deploy/nginx.conf's
    nginx (which answers 400 to `%00` itself): another proxy, TRUSTED_PROXY_COUNT=0, `make run`."""
    settings.DEBUG = False
    settings.ADMINS = [("Operators", "ops@example.org")]
    stranger = Client(raise_request_exception=False)
    with warnings.catch_warnings():
        # Production runs without the test suite's warning filters: the key only warns there, then the query fails.
        warnings.simplefilter("ignore", CacheKeyWarning)
        response = stranger.get(path)
    assert response.status_code == 404, response.status_code
    assert not [message for message in mail.outbox if "ops@example.org" in message.to]


@pytest.mark.django_db
def test_a_nul_byte_in_an_invoice_number_is_a_404(settings, client, catalog, booking_data):
    """The invoice PDF address with a NUL in the invoice number is a 404 for the order's holder, not a 500 mailed to
    the operators (PostgreSQL refuses NUL in text): the number's converter excludes control characters."""
    order, token = place(client, booking_data())
    settings.DEBUG = False
    holder = Client(raise_request_exception=False)
    response = holder.get(f"/orders/{order.public_id}/{token}/invoices/%00.pdf")
    assert response.status_code == 404, response.status_code
