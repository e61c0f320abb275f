"""What a scan cycle costs on a real node (anvil behind the project's RPC proxy): blocks not final yet are checked by
header and read again in full only when replaced; a long catch-up commits and renews its lease batch by batch."""

import time
from datetime import timedelta

from booking.models import OrderStatus
from payments import scanner
from payments.chain import ChainClient
from payments.demo import pay_invoice
from payments.models import ChainCursor, Invoice, Transfer
from tests.builders.payments import pay_in_eth, scan

CHAIN_ID = 31337


def test_a_cycle_with_nothing_new_reads_block_headers_only(client, chain, booking_data, proxies, use_chains_file):
    proxy = proxies()
    use_chains_file(proxy.url)
    order, invoice = pay_in_eth(client, booking_data)
    scan()
    pay_invoice(chain, invoice)  # mined in a block of its own: seen, not final yet
    scan()
    assert Transfer.objects.get(invoice=invoice).status == Transfer.Status.SEEN

    proxy.reset_counts()
    scan()  # nothing new on chain

    assert proxy.full_blocks == 0, proxy.calls
    assert Transfer.objects.get(invoice=invoice).status == Transfer.Status.SEEN

    proxy.reset_counts()
    chain.mine(3)  # the payment's block becomes final
    scan()

    assert proxy.full_blocks == 3  # the new blocks only, not the payment's again
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert Transfer.objects.get(invoice=invoice).status == Transfer.Status.CONFIRMED
    assert invoice.status == Invoice.Status.SETTLED and order.status == OrderStatus.PAID


def test_a_block_replaced_since_the_last_cycle_is_read_again_in_full(
    client, chain, booking_data, proxies, use_chains_file
):
    proxy = proxies()
    use_chains_file(proxy.url)
    _order, invoice = pay_in_eth(client, booking_data)
    scan()
    chain.mine(1)
    before = chain.snapshot()
    pay_invoice(chain, invoice)
    scan()
    assert Transfer.objects.get(invoice=invoice).status == Transfer.Status.SEEN

    chain.revert(before)  # the payment's block is replaced by an empty one at the same height
    chain.mine(1)
    proxy.reset_counts()
    scan()

    assert proxy.full_blocks == 1  # the replaced block; the one under it kept its hash
    invoice.refresh_from_db()
    assert Transfer.objects.get(invoice=invoice).status == Transfer.Status.REMOVED
    assert invoice.status == Invoice.Status.NEW and invoice.amount_pending_units == 0
    chain.snapshot()  # the fixture reverts to its own snapshot afterwards


def test_a_long_catch_up_keeps_its_lease_batch_by_batch_and_a_second_scan_skips(
    client, chain, booking_data, monkeypatch
):
    order, invoice = pay_in_eth(client, booking_data)
    scan()
    start = ChainCursor.objects.get(chain_id=CHAIN_ID).confirmed_block
    chain.mine(20)
    pay_invoice(chain, invoice)  # near the end of the catch-up
    chain.mine(5)

    # Batches of 5 blocks, slow enough that the catch-up outlives a lease of two seconds by far.
    lease = timedelta(seconds=2)
    monkeypatch.setattr(scanner, "SCAN_LEASE", lease)
    monkeypatch.setattr(scanner, "CATCH_UP_BATCH", 5)
    read = ChainClient.block_range
    cursors, second_scans, began = [], [], []

    def slow_block_range(self, **kwargs):
        cursors.append(ChainCursor.objects.get(chain_id=CHAIN_ID).confirmed_block)
        if len(cursors) == 5:  # more than a lease after the scan began: another scan must still find it held
            assert time.monotonic() - began[0] > lease.total_seconds()
            second_scans.append(scanner.chain_scan(chain_id=CHAIN_ID))
        time.sleep(0.6)
        return read(self, **kwargs)

    monkeypatch.setattr(ChainClient, "block_range", slow_block_range)
    began.append(time.monotonic())
    result = scan()

    assert [second.skipped for second in second_scans] == [True]
    assert cursors == sorted(set(cursors)) and len(cursors) >= 5 and cursors[1] > start  # committed per batch
    assert ChainCursor.objects.get(chain_id=CHAIN_ID).confirmed_block == result.confirmed
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and order.status == OrderStatus.PAID


def test_a_new_deposit_address_makes_the_next_cycle_read_the_blocks_not_final_in_full_once(
    client, chain, booking_data, proxies, use_chains_file
):
    """A block read before an address was watched may have paid it: its hash alone cannot tell."""
    proxy = proxies()
    use_chains_file(proxy.url)
    pay_in_eth(client, booking_data)
    scan()
    chain.mine(2)
    scan()
    proxy.reset_counts()
    scan()
    assert proxy.full_blocks == 0

    pay_in_eth(client, booking_data, contact_email="second@example.org")  # a new invoice, a new address
    proxy.reset_counts()
    result = scan()

    cursor = ChainCursor.objects.get(chain_id=CHAIN_ID).confirmed_block
    assert proxy.full_blocks == result.head - cursor > 0
    proxy.reset_counts()
    scan()
    assert proxy.full_blocks == 0
