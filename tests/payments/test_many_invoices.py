"""10,000 open invoices on one chain: the scan's requests and time do not grow with them, and an honest payment
among them is credited within the detection target (anvil, PostgreSQL, the limiting proxy)."""

import time

from django.conf import settings

from booking.models import OrderStatus
from payments import balances, invoices, scanner
from payments.addresses import deposit_addresses
from payments.demo import pay_invoice
from payments.models import DerivationSlot, Invoice
from payments.selectors import current_invoice
from tests.booking.test_pages import place

OPEN_INVOICES = 10_000


def crowd_invoices(model: Invoice, count: int) -> None:
    """`count` open invoices like `model`, each with its own derived address, written in bulk: invoice_create
    one by one takes a minute for 10,000 (an xpub parse and a few queries each), which this test is not about."""
    slots = DerivationSlot.objects.bulk_create([DerivationSlot() for _ in range(count)])
    indexes = [slot.pk for slot in slots]
    addresses = deposit_addresses(settings.PAYMENTS_XPUB, indexes)
    fields = {
        field.attname: getattr(model, field.attname)
        for field in Invoice._meta.concrete_fields
        if field.attname not in ("id", "derivation_index", "deposit_address")
    }
    Invoice.objects.bulk_create(
        [Invoice(**fields, derivation_index=index, deposit_address=addresses[index].lower()) for index in indexes],
        batch_size=2000,
    )


def test_an_honest_payment_among_10000_open_invoices_is_credited_within_the_target(
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
    alone_result = scanner.chain_scan(chain_id=31337)
    alone = (strict.requests, strict.largest_request)

    crowd_invoices(waiting, OPEN_INVOICES // 2)
    crowd_invoices(native, OPEN_INVOICES // 2 - balances.NATIVE_BALANCE_CHECKS_PER_CYCLE - 3)
    order, _ = place(client, booking_data(lots="1"))
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)

    strict.reset_counts()
    started = time.perf_counter()
    result = scanner.chain_scan(chain_id=31337)
    elapsed = time.perf_counter() - started

    order.refresh_from_db()
    assert result.invoices >= OPEN_INVOICES and order.status == OrderStatus.PAID
    assert elapsed < 2, f"a scan of {result.invoices} open invoices took {elapsed:.2f} s"
    assert result.balance_checks == alone_result.balance_checks == balances.NATIVE_BALANCE_CHECKS_PER_CYCLE
    # The same calls; the largest request (the balances batch) the same but for longer block numbers in hex.
    assert strict.requests == alone[0] and strict.largest_request <= alone[1] + 4 * result.balance_checks
