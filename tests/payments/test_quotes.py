"""Quotes from checked inputs: a rate feed's answer is refused when stale, carried over from an earlier round, for
another currency, or when the address holds no contract; the customer gets a clear message, never a 500 (anvil)."""

import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from payments import config, invoices, quotes, scanner
from payments.demo import DEMO_ETH_EUR
from payments.selectors import current_invoice
from tests.builders.orders import place

CHAIN_ID = 31337
DEMO_FEED = "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0"  # as payments/chains.demo.toml writes it


def feed_address() -> str:
    return config.chain(CHAIN_ID).asset("ETH").rate_feed


def switch_to_eth(client, order, token):
    return client.post(
        reverse("customer:order-asset", kwargs={"public_id": order.public_id, "token": token}),
        {"asset": f"{CHAIN_ID}:ETH"},
        follow=True,
    )


def test_a_fresh_feed_answer_prices_the_invoice_with_its_round(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    switch_to_eth(client, order, token)
    invoice = current_invoice(order)
    assert invoice.asset_symbol == "ETH" and " round " in invoice.rate_source


def test_a_feed_answer_older_than_its_heartbeat_is_refused(client, chain, booking_data):
    order, _token = place(client, booking_data(lots="1"))

    with pytest.raises(quotes.FeedRefused) as refused:
        invoices.invoice_change_asset(order=order, asset_key=f"{CHAIN_ID}:ETH", now=timezone.now() + timedelta(hours=2))

    assert "beyond the heartbeat of 3600 s" in refused.value.reason
    assert current_invoice(order).asset_symbol == "dEURC"  # nothing replaced


def test_an_answer_carried_over_from_an_earlier_round_is_refused_on_the_page(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    chain.call(
        "MockAggregator",
        feed_address(),
        "setRoundData",
        7,
        DEMO_ETH_EUR,
        int(time.time()),
        6,
        sender=chain.accounts()[0],
    )

    page = switch_to_eth(client, order, token)

    assert page.status_code == 200
    assert "The ETH rate cannot be trusted right now." in page.content.decode().replace("&#x27;", "'")
    assert current_invoice(order).asset_symbol == "dEURC"


@pytest.mark.parametrize(
    ("feed", "reason"),
    [
        ("usd", "quotes 'ETH / USD', not a price in EUR"),
        ("btc", "quotes 'BTC / EUR', not the price of ETH"),  # a BTC feed set for ETH would price it 20 times low
        ("no-code", "no contract at 0x1212"),
    ],
)
def test_a_feed_for_another_currency_or_without_a_contract_is_refused(
    client, chain, booking_data, settings, tmp_path, feed, reason
):
    from tests.payments.conftest import chains_toml

    if feed == "usd":
        address = chain.deploy("MockAggregator", 8, 2700 * 10**8, "ETH / USD", sender=chain.accounts()[0])
    elif feed == "btc":
        address = chain.deploy("MockAggregator", 8, 60000 * 10**8, "BTC / EUR", sender=chain.accounts()[0])
    else:
        address = "0x" + "12" * 20
    path = tmp_path / "feed.toml"
    path.write_text(chains_toml(chain.chain.rpc_urls[0]).replace(DEMO_FEED, address))
    settings.PAYMENTS_CHAINS_FILE = str(path)
    order, token = place(client, booking_data(lots="1"))

    with pytest.raises(quotes.FeedRefused) as refused:
        invoices.invoice_change_asset(order=order, asset_key=f"{CHAIN_ID}:ETH")
    assert reason in refused.value.reason
    assert switch_to_eth(client, order, token).status_code == 200  # the page says so; never a 500


def test_switching_asset_is_rate_limited_per_order(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    for asset in ("dUSDT", "dEURC", "dUSDT", "dEURC", "dUSDT"):
        invoices.invoice_change_asset(order=order, asset_key=f"{CHAIN_ID}:{asset}")

    page = client.post(
        reverse("customer:order-asset", kwargs={"public_id": order.public_id, "token": token}),
        {"asset": f"{CHAIN_ID}:dEURC"},
        follow=True,
    )

    assert page.status_code == 200
    assert "The payment method was changed too often." in page.content.decode()
    assert current_invoice(order).asset_symbol == "dUSDT"
    assert order.invoices.count() == 6


def test_a_replaced_quote_that_received_nothing_stops_being_watched_when_it_would_have_expired(
    client, chain, booking_data
):
    from payments.demo import pay_invoice
    from payments.models import Invoice, Transfer

    order, _token = place(client, booking_data(lots="1"))
    replaced = current_invoice(order)
    invoices.invoice_change_asset(order=order, asset_key=f"{CHAIN_ID}:dUSDT")
    now = timezone.now()
    assert replaced.deposit_address in scanner._watched_addresses(CHAIN_ID, now)

    after_expiry = replaced.expires_at + timedelta(minutes=1)
    assert replaced.deposit_address not in scanner._watched_addresses(CHAIN_ID, after_expiry)
    assert current_invoice(order).deposit_address in scanner._watched_addresses(CHAIN_ID, after_expiry)

    # Before that, a payment still sent there is recorded and kept for an operator.
    pay_invoice(chain, Invoice.objects.get(pk=replaced.pk))
    chain.mine(2)
    scanner.chain_scan(chain_id=CHAIN_ID)
    replaced.refresh_from_db()
    assert Transfer.objects.get().invoice_id == replaced.pk and replaced.needs_operator
    assert replaced.deposit_address in scanner._watched_addresses(CHAIN_ID, after_expiry)  # it received something
