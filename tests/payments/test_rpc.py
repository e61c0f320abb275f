"""The chain adapter facing unfriendly providers: limits, rate limits, refused getLogs ranges, garbage, lagging
heads (a real anvil behind tests/payments/rpc_proxy.py, a JSON-RPC proxy that enforces common providers' limits
and misbehaves on purpose)."""

import dataclasses

import pytest

from booking.models import OrderStatus
from payments import config, invoices, scanner
from payments.chain import ChainClient, ChainUnavailable
from payments.demo import pay_invoice
from payments.models import ChainCursor
from payments.selectors import current_invoice
from tests.builders.orders import place
from tests.payments.conftest import Anvil, chains_toml
from tests.payments.rpc_proxy import LimitingProxy


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

    scanner.chain_scan(chain_id=31337, client=ChainClient(config.chain(31337), backoff=0.01))

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert limited.requests >= 1  # asked first, answered 429, and the scan went on with the second URL

    # The next scans (any worker) ask the healthy URL first while the limited one cools down.
    asked = limited.requests
    chain.mine(1)
    scanner.chain_scan(chain_id=31337, client=ChainClient(config.chain(31337), backoff=0.01))
    assert limited.requests == asked


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

    scanner.chain_scan(chain_id=31337)

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert narrow.refused["range"] >= 1


def test_a_json_rpc_rate_limit_fails_over_without_shrinking_the_range(
    client, chain, booking_data, proxies, use_chains_file
):
    # Infura answers a rate limit with -32005, the same code as a too-wide eth_getLogs: the words decide.
    limited, healthy = proxies(rate_limit="rpc", rate_limit_methods=frozenset({"eth_getLogs"})), proxies()
    use_chains_file(limited.url, healthy.url)
    order, _ = place(client, booking_data(lots="1"))
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)

    client_ = ChainClient(config.chain(31337), backoff=0.01)
    scanner.chain_scan(chain_id=31337, client=client_)

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert limited.refused["rpc -32005"] == 1 and any("rate limited" in error for error in client_.errors)
    first, second = limited.log_queries[0], healthy.log_queries[0]
    assert (first["fromBlock"], first["toBlock"]) == (second["fromBlock"], second["toBlock"])  # not narrowed


def test_a_getlogs_answer_over_the_providers_result_cap_is_asked_again_in_narrower_ranges(
    client, chain, booking_data, proxies, use_chains_file
):
    capped = proxies(max_logs=1)
    use_chains_file(capped.url)
    first, _ = place(client, booking_data(lots="1"))
    second, _ = place(client, booking_data(lots="1", contact_email="b@example.org"))
    scanner.chain_scan(chain_id=31337)
    chain.mine(3)
    pay_invoice(chain, current_invoice(first))
    chain.mine(3)
    pay_invoice(chain, current_invoice(second))
    chain.mine(3)

    scanner.chain_scan(chain_id=31337)

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == second.status == OrderStatus.PAID
    assert capped.refused["too many results"] >= 1


def test_requests_stay_inside_provider_caps_and_do_not_grow_with_the_invoices(
    client, chain, booking_data, proxies, use_chains_file
):
    strict = proxies(max_batch=1000, max_topics=1000, max_range=2000)
    use_chains_file(strict.url)
    order, _ = place(client, booking_data(lots="1"))
    scanner.chain_scan(chain_id=31337)

    def one_cycle() -> tuple[int, int, dict]:
        chain.mine(1)
        strict.reset_counts()
        scanner.chain_scan(chain_id=31337)
        return strict.requests, strict.largest_request, dict(strict.calls)

    few = one_cycle()
    for _ in range(60):  # 60 more open invoices, on the same order
        invoices.invoice_create(order=order, fiat_amount=current_invoice(order).fiat_amount)
    # The first cycle after new deposit addresses reads the blocks not final yet in full once more (one may have
    # paid them before they were watched); the next costs what it cost with one invoice.
    one_cycle()
    many = one_cycle()

    assert few == many and few[0] <= 5
    assert not strict.refused


def test_garbage_from_every_url_is_recorded_as_unavailable_never_raised_from_the_task(
    client, chain, booking_data, proxies, use_chains_file
):
    from payments.models import ChainCursor
    from payments.tasks import scan_chain
    from tests.builders.payments import order_page

    order, token = place(client, booking_data(lots="1"))
    use_chains_file(proxies(garbage=True).url, proxies(garbage=True).url)

    assert scan_chain.delay(31337).get() == 0  # no exception escapes the task

    cursor = ChainCursor.objects.get(chain_id=31337)
    assert cursor.unavailable_since is not None and "JSONDecodeError" in cursor.last_error
    page = client.get(f"/orders/{order.public_id}/{token}/")
    assert page.status_code == 200 and "Check delayed" in order_page(client, order, token)


def test_a_provider_key_in_a_url_never_reaches_the_cursor_or_the_logs(
    client, chain, booking_data, proxies, use_chains_file, caplog
):
    """Providers put their API key in the URL's path or query: failures name the host only."""
    from payments.tasks import scan_chain

    place(client, booking_data(lots="1"))
    garbage = proxies(garbage=True).url.rstrip("/")
    use_chains_file(f"{garbage}/v3/SECRET-PATH-KEY?apikey=SECRET-QUERY-KEY", "http://127.0.0.1:9/SECRET-DEAD-KEY")

    assert scan_chain.delay(31337).get() == 0
    cursor = ChainCursor.objects.get(chain_id=31337)
    assert "127.0.0.1" in cursor.last_error and "JSONDecodeError" in cursor.last_error
    for secret in ("SECRET-PATH-KEY", "SECRET-QUERY-KEY", "SECRET-DEAD-KEY"):
        assert secret not in cursor.last_error
        assert secret not in caplog.text


def test_a_lagging_node_is_passed_over_and_the_cursor_never_goes_back(
    client, chain, booking_data, proxies, use_chains_file
):
    from payments.chain import ChainUnavailable
    from payments.models import ChainCursor

    order, _token = place(client, booking_data(lots="1"))
    chain.mine(30)
    scanner.chain_scan(chain_id=31337)
    before = ChainCursor.objects.get(chain_id=31337).confirmed_block
    lagging = proxies(lag=20)
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)

    use_chains_file(lagging.url, chain.chain.rpc_urls[0], name="lagging-first")
    client_ = ChainClient(config.chain(31337))
    result = scanner.chain_scan(chain_id=31337, client=client_)

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID and result.confirmed > before
    assert "lagging" in client_.errors[0]

    # Only the lagging node left: nothing moves back, a waiting order's page says the check is delayed.
    waiting, waiting_token = place(client, booking_data(lots="1", contact_email="w@example.org"))
    use_chains_file(lagging.url, name="lagging-only")
    reached = ChainCursor.objects.get(chain_id=31337).confirmed_block
    try:
        scanner.chain_scan(chain_id=31337)
    except ChainUnavailable as exc:
        assert "lagging" in str(exc)
    else:
        raise AssertionError("a node behind the cursor answered the scan")
    cursor = ChainCursor.objects.get(chain_id=31337)
    assert cursor.confirmed_block == reached and cursor.unavailable_since is not None
    from tests.builders.payments import order_page

    assert "Check delayed" in order_page(client, waiting, waiting_token)


def test_batches_are_split_at_the_chains_cap(client, chain, booking_data, proxies, use_chains_file, settings):
    strict = proxies(max_batch=2)
    use_chains_file(strict.url)
    path = settings.PAYMENTS_CHAINS_FILE
    with open(path) as file:
        text = file.read().replace("max_block_range = 2000", "max_block_range = 2000\nmax_batch = 2")
    with open(path, "w") as file:
        file.write(text)
    order, token = place(client, booking_data(lots="1"))
    client.post(f"/orders/{order.public_id}/{token}/asset/", {"asset": "31337:ETH"})
    invoice = current_invoice(order)
    assert invoice.asset_symbol == "ETH"
    pay_invoice(chain, invoice)
    chain.mine(3)

    scanner.chain_scan(chain_id=31337)

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID and not strict.refused


def _rpc(url: str, method: str, params: list) -> object:
    import json
    import urllib.request

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["result"]


@pytest.fixture
def stray_node():
    """Another anvil, ahead of the session's by a thousand blocks, on the chain id asked for."""
    made = []

    def make(chain_id: int) -> tuple[Anvil, LimitingProxy]:
        node = Anvil(chain_id=chain_id)
        node.start()
        proxy = LimitingProxy(node.url)
        made.append((node, proxy))
        return node, proxy

    yield make
    for node, proxy in made:
        proxy.close()
        node.stop()


@pytest.mark.parametrize(
    ("stray_chain_id", "logged"), [(999, "serves chain 999"), (31337, "more than 64 blocks ahead of the others")]
)
def test_a_url_on_another_chain_or_far_ahead_is_set_aside_and_the_cursor_stays_on_the_real_chain(
    client, chain, booking_data, proxies, use_chains_file, stray_node, caplog, stray_chain_id, logged
):
    # given: the first URL serves another chain (or a chain whose head is far ahead), behind a key in its path
    stray, counted = stray_node(stray_chain_id)
    real_head = int(chain.request("eth_blockNumber", []), 16)
    _rpc(stray.url, "anvil_mine", [hex(real_head + 1000)])
    use_chains_file(f"{counted.url}/v3/secret-key-123", proxies().url)
    order, _ = place(client, booking_data(lots="1"))
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)
    real_head = int(chain.request("eth_blockNumber", []), 16)

    # when
    scanner.chain_scan(chain_id=31337, client=ChainClient(config.chain(31337), backoff=0.01))

    # then: the payment is found through the good URL, and nothing of the stray one was believed
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    cursor = ChainCursor.objects.get(chain_id=31337)
    assert cursor.confirmed_block <= real_head and cursor.head_block <= real_head
    assert logged in caplog.text and f"127.0.0.1:{counted.url.rsplit(':', 1)[1]}" in caplog.text
    assert "secret-key" not in caplog.text
    assert set(counted.calls) <= {"eth_chainId", "eth_blockNumber"}  # asked who it is, never used after


@pytest.mark.parametrize(
    "refusal",
    [
        "block range extends beyond current head block: requested 0xffffffff, head {head}",  # geth, reth
        "requested to block 0xffffffff after last accepted block {head}",  # Avalanche
        None,  # a backend that silently clamps the range to its own head
    ],
)
def test_a_token_payment_in_blocks_a_lagging_logs_backend_lacks_is_credited_once_it_catches_up(
    client, chain, booking_data, proxies, use_chains_file, refusal
):
    # given: behind one URL, eth_getLogs reaches a backend 6 blocks behind the one that answers eth_blockNumber
    balanced = proxies(logs_lag=6, logs_lag_error=refusal)
    use_chains_file(balanced.url)
    order, _ = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    assert invoice.asset_contract  # a token: found by its Transfer log only
    receipt_hash = pay_invoice(chain, invoice)
    paid_at = int(chain.request("eth_getTransactionReceipt", [receipt_hash])["blockNumber"], 16)
    chain.mine(3)

    # when: the lagging backend answers the scan
    lagging = scanner.chain_scan(chain_id=31337)

    # then: nothing is passed as read, and the range is not narrowed block by block
    order.refresh_from_db()
    assert order.status == OrderStatus.AWAITING_PAYMENT
    assert ChainCursor.objects.get(chain_id=31337).confirmed_block < paid_at
    assert lagging.not_ready_from is not None and lagging.not_ready_from <= paid_at
    assert balanced.refused["beyond head" if refusal else "clamped"] >= 1 and len(balanced.log_queries) <= 2

    # when: the backend catches up, the payment is credited within two cycles, in few calls
    balanced.logs_lag = 0
    calls = lagging.rpc_calls
    for _ in range(2):
        calls += scanner.chain_scan(chain_id=31337).rpc_calls
        order.refresh_from_db()
        if order.status == OrderStatus.PAID:
            break
    assert order.status == OrderStatus.PAID
    assert calls < 50


def test_a_url_that_failed_shows_its_chain_id_again_before_it_is_believed(chain, proxies, stray_node, caplog):
    # given: a URL checked and answering for the chain
    switching = proxies()
    client_ = ChainClient(dataclasses.replace(config.chain(31337), rpc_urls=(switching.url,)), backoff=0.01)
    client_.head()

    # when: it fails once, then its load balancer sends it to a node of another chain
    switching.garbage = True
    with pytest.raises(ChainUnavailable):
        client_.request("eth_blockNumber", [])
    stray, _counted = stray_node(999)
    switching.garbage, switching.upstream = False, stray.url

    # then: it is asked its chain id again, and nothing it says is used
    with pytest.raises(ChainUnavailable):
        client_.request("eth_blockNumber", [])
    assert switching.calls["eth_chainId"] == 2 and "serves chain 999" in caplog.text


def test_a_url_stuck_far_behind_the_cursor_does_not_make_the_healthy_one_look_too_far_ahead(
    client, chain, booking_data, proxies, use_chains_file
):
    # given: a scanned chain, and a first URL stuck 100 blocks behind (more than the 64 a head may lead by)
    order, _ = place(client, booking_data(lots="1"))
    chain.mine(120)
    scanner.chain_scan(chain_id=31337)
    use_chains_file(proxies(lag=100).url, chain.chain.rpc_urls[0], name="stuck-first")
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)

    # when
    scanner.chain_scan(chain_id=31337, client=ChainClient(config.chain(31337), backoff=0.01))

    # then: the healthy URL's head is believed and the payment found
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
