"""The chain adapter facing unfriendly providers: limits, rate limits, refused getLogs ranges, garbage, lagging
heads (a real anvil behind tests/payments/rpc_proxy.py, a JSON-RPC proxy that enforces common providers' limits
and misbehaves on purpose)."""

from booking.models import OrderStatus
from payments import config, services
from payments.chain import ChainClient
from payments.demo import pay_invoice
from payments.selectors import current_invoice
from tests.booking.test_pages import place
from tests.payments.conftest import chains_toml


def test_a_rate_limited_provider_is_backed_off_and_the_next_url_answers(
    client, chain, booking_data, proxies, settings, tmp_path
):
    limited = proxies(rate_limit="http")
    path = tmp_path / "limited.toml"
    path.write_text(chains_toml(limited.url, chain.chain.rpc_urls[0]))
    settings.PAYMENTS_CHAINS_FILE = str(path)
    order, _ = place(client, booking_data(lots="1"))
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)

    services.chain_scan(chain_id=31337, client=ChainClient(config.chain(31337), backoff=0.01))

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert limited.requests >= 1  # asked first, answered 429, and the scan went on with the second URL


def test_a_refused_getlogs_range_is_shrunk_until_the_provider_accepts_it(
    client, chain, booking_data, proxies, settings, tmp_path
):
    narrow = proxies(max_range=16)
    path = tmp_path / "narrow.toml"
    path.write_text(chains_toml(narrow.url))
    settings.PAYMENTS_CHAINS_FILE = str(path)
    order, _ = place(client, booking_data(lots="1"))
    chain.mine(40)  # a range wider than the provider accepts
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)

    services.chain_scan(chain_id=31337)

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert narrow.refused["range"] >= 1
