"""E-mails go to addresses nobody verified: they carry nothing a stranger typed but a plain greeting."""

import re

import pytest
from django.core import mail

from booking.models import plain_name
from tests.builders.orders import place


@pytest.mark.parametrize(
    ("typed", "greeting"),
    [
        ("Ada Lovelace", "Ada Lovelace"),
        ("  Marie   Skłodowska-Curie ", "Marie Skłodowska-Curie"),
        ("J. R. R. Tolkien", "J. R. R. Tolkien"),
        ("Seán O’Brien", "Seán O’Brien"),
        ("李小龙", "李小龙"),
        ("Pay now at evil.example", ""),
        ("https://evil.example/pay", ""),
        ("Ada www.evil.example", ""),
        ("ada@example.org", ""),
        ("Call 0800 123 456", ""),
        ("xn--80ak6aa92e", ""),
        ("Your account is suspended click here now", ""),  # more than five words
        ("A" * 61, ""),
        ("-Ada", ""),
        ("", ""),
    ],
)
def test_a_name_is_kept_for_the_greeting_only_when_it_reads_as_a_name(typed, greeting):
    assert plain_name(typed) == greeting


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "greeting"),
    [("Ada Lovelace", "Hello Ada Lovelace,"), ("Renew at paypal-secure.example today", "Hello,")],
)
def test_the_order_email_greets_by_name_or_plainly_and_carries_nothing_else_typed(
    client, booking_data, django_capture_on_commit_callbacks, name, greeting
):
    with django_capture_on_commit_callbacks(execute=True):
        order, _token = place(
            client,
            booking_data(contact_name=name, organisation="Visit evil.example now", notes="http://evil.example"),
        )

    body = mail.outbox[-1].body
    assert body.startswith(greeting + "\n")
    assert "evil" not in body and "paypal" not in body
    assert re.findall(r"https?://\S+", body) == [re.search(r"http://127\.0\.0\.1:8000/orders/\S+/", body).group()]
    assert order.contact_name == name  # kept for the operators, never mailed
