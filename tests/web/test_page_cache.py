"""The booking page comes from a shared cache, yet never shows stale availability or someone else's token."""

import re
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from booking.models import Order, Price

pytestmark = pytest.mark.django_db


def free_b200(client, booking_data) -> str:
    choice = {key: booking_data()[key] for key in ("hardware_class", "environment", "start_date", "days")}
    page = client.get(reverse("customer:book"), {**choice, "lots": "1"}, headers={"HX-Request": "true"})
    return re.search(r'<td class="(?:free|none)">(\d+ / \d+)</td>', page.content.decode()).group(1)


def test_a_booking_and_a_cancellation_show_at_once_on_the_cached_page(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    assert free_b200(client, booking_data) == "6 / 6"
    assert free_b200(client, booking_data) == "6 / 6"  # now from the cache

    # The cache is invalidated when the booking commits (the test database never commits: run the callbacks).
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("customer:book"), booking_data(lots="4"))
    client.get(response["Location"])
    assert free_b200(client, booking_data) == "2 / 6"

    with django_capture_on_commit_callbacks(execute=True):
        client.post(response["Location"] + "cancel/")
    assert free_b200(client, booking_data) == "6 / 6"


def test_a_price_changed_in_the_admin_shows_at_once(client, catalog, booking_data, django_capture_on_commit_callbacks):
    assert "3150.00 EUR" in client.get("/").content.decode()
    client.post(reverse("customer:book"), booking_data(lots="99"))  # a refused booking: the catalog is cached too

    price = Price.objects.get(hardware_class=catalog["b200-pair"], days=7)
    price.amount_per_lot = "2999.00"
    with django_capture_on_commit_callbacks(execute=True):
        price.save()

    assert "2999.00 EUR" in client.get("/").content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(reverse("customer:book"), booking_data(lots="1")).status_code == 302
    assert Order.objects.get().price_per_lot == Decimal("2999.00")  # the new price, not the cached catalog's


def test_each_visitor_gets_a_working_csrf_token_of_their_own(catalog, booking_data):
    first, second = Client(enforce_csrf_checks=True), Client(enforce_csrf_checks=True)
    tokens = []
    for visitor in (first, second):
        page = visitor.get("/").content.decode()
        tokens.append(re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1))
        assert "__binome_csrf_token__" not in page
    assert tokens[0] != tokens[1]

    assert second.post("/", {**booking_data(), "csrfmiddlewaretoken": tokens[1]}).status_code == 302
    assert first.post("/", {**booking_data(), "csrfmiddlewaretoken": "forged" * 8}).status_code == 403
    assert Order.objects.count() == 1


def test_a_cached_page_costs_no_query(client, catalog, django_assert_num_queries):
    # the catalog, the policy, availability, the current terms version, the hosts' leads and the lots free at the
    # earliest start as soon as ready
    with django_assert_num_queries(8):
        client.get("/")
    with django_assert_num_queries(0):
        assert client.get("/").status_code == 200


def test_pages_are_cached_per_language(client, catalog):
    assert '<html lang="en">' in client.get("/").content.decode()
    client.cookies["django_language"] = "fr"
    assert '<html lang="fr">' in client.get("/").content.decode()


def test_queries_with_unknown_parameters_are_not_cached_but_still_served(client, catalog, django_assert_num_queries):
    with django_assert_num_queries(8):
        assert client.get("/", {"utm_source": "x" * 500}).status_code == 200
    with django_assert_num_queries(3):  # drawn again: availability (and today's earliest start) read anew
        assert client.get("/", {"utm_source": "x" * 500}).status_code == 200
