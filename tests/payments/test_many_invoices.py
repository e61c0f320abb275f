"""10,000 open invoices on one chain: the scan's requests to the node and its queries do not grow with them, and an
honest payment among them is credited by the next scan (anvil, PostgreSQL, the limiting proxy). The detection
latency in seconds is bench/chain_scan.py's figure."""

from collections import Counter

from django.db import connection
from django.test.utils import CaptureQueriesContext

from booking.models import OrderStatus
from payments import balances, invoices, scanner
from payments.demo import pay_invoice
from payments.selectors import current_invoice
from tests.builders.orders import place
from tests.builders.payments import crowd_invoices

OPEN_INVOICES = 10_000


def test_an_honest_payment_among_10000_open_invoices_is_credited_by_a_scan_that_costs_what_one_costs(
    client, chain, booking_data, proxies, use_chains_file
):
    """Half of them in the native coin: their balances are reconciled at most NATIVE_BALANCE_CHECKS_PER_CYCLE a
    cycle, so once that many wait, nothing in a cycle's requests grows any more."""
    strict = proxies(max_range=2000)
    use_chains_file(strict.url)
    crowd, _ = place(client, booking_data(lots="1", contact_email="crowd@example.org"))
    in_coin, _ = place(client, booking_data(lots="1", contact_email="coin@example.org"))
    native = invoices.invoice_change_asset(order=in_coin, asset_key="31337:ETH")
    crowd_invoices(native, balances.NATIVE_BALANCE_CHECKS_PER_CYCLE)
    scanner.chain_scan(chain_id=31337)
    waiting = current_invoice(crowd)  # as it is before its payment: the model of the crowd
    pay_invoice(chain, waiting)
    chain.mine(2)
    strict.reset_counts()
    with CaptureQueriesContext(connection) as alone_queries:
        alone_result = scanner.chain_scan(chain_id=31337)
    alone = (strict.requests, strict.largest_request)

    crowd_invoices(waiting, OPEN_INVOICES // 2)
    crowd_invoices(native, OPEN_INVOICES // 2 - balances.NATIVE_BALANCE_CHECKS_PER_CYCLE - 3)
    order, _ = place(client, booking_data(lots="1"))
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)

    strict.reset_counts()
    with CaptureQueriesContext(connection) as queries:
        result = scanner.chain_scan(chain_id=31337)

    order.refresh_from_db()
    assert result.invoices >= OPEN_INVOICES and order.status == OrderStatus.PAID
    # As many queries as with a handful of open invoices: none for each invoice.
    assert len(queries) == len(alone_queries), Counter(query["sql"][:120] for query in queries).most_common(3)
    assert result.balance_checks == alone_result.balance_checks == balances.NATIVE_BALANCE_CHECKS_PER_CYCLE
    # The same calls; the largest request (the balances batch) the same but for longer block numbers in hex.
    assert strict.requests == alone[0] and strict.largest_request <= alone[1] + 4 * result.balance_checks
