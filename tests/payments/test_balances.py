"""The balance safety net (payments/balances.py), on anvil: a token payment the cursor's log reading missed is
found from the balance once the customer says "I've paid", and credited once under its own transaction; native
coin paid by a contract shortly before expiry is credited as paid on time, even when the scan only runs after the
expiry; a balance that rises in another token, or at another address, credits nothing."""

from datetime import timedelta

import pytest
from django.urls import reverse

from booking.models import OrderStatus
from payments import balances, config, invoices, scanner
from payments.demo import pay_invoice
from payments.models import ChainCursor, Invoice, Transfer
from payments.selectors import current_invoice
from tests.builders.orders import place
from tests.builders.payments import cursor_past_the_head, forward_at, pay_in_eth
from tests.payments.conftest import chains_toml

CHAIN_ID = 31337


def scan(**kwargs) -> scanner.ScanResult:
    return scanner.chain_scan(chain_id=CHAIN_ID, **kwargs)


# --- tokens ----------------------------------------------------------------------------------------------------
def test_a_token_payment_the_cursor_missed_is_found_from_the_balance_after_i_have_paid(client, chain, booking_data):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    assert invoice.asset_contract  # a token invoice
    tx_hash = pay_invoice(chain, invoice)
    chain.mine(3)
    cursor_past_the_head(chain)  # the scan never reads that block
    scan()
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.NEW and not Transfer.objects.filter(invoice=invoice).exists()

    invoices.invoice_customer_paid(invoice=invoice)  # the check it asks for runs here (eager Celery)

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and order.status == OrderStatus.PAID
    assert not invoice.paid_late and not invoice.paid_over
    credit = Transfer.objects.get(invoice=invoice)
    assert credit.tx_hash == tx_hash.lower() and credit.log_index >= 0  # the transfer itself, not a balance
    assert credit.status == Transfer.Status.CONFIRMED and credit.block_time is not None

    # The scan reads the block after all (the cursor put back), and "I've paid" again: still one credit.
    ChainCursor.objects.filter(chain_id=CHAIN_ID).update(confirmed_block=0)
    scan()
    invoices.invoice_customer_paid(invoice=invoice)
    invoice.refresh_from_db()
    assert Transfer.objects.filter(invoice=invoice).count() == 1
    assert invoice.amount_confirmed_units == invoice.amount_due_units and not invoice.paid_over


def test_an_admins_recheck_finds_a_token_payment_the_cursor_missed(client, chain, booking_data, admin_user):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    invoices.invoice_customer_paid(invoice=invoice)  # too early: its balance is read, and shows nothing yet
    assert Invoice.objects.get(pk=invoice.pk).native_checked_at is not None
    pay_invoice(chain, invoice)
    chain.mine(3)
    cursor_past_the_head(chain)
    client.force_login(admin_user)

    client.post(
        reverse("admin:payments_invoice_changelist"), {"action": "recheck_on_chain", "_selected_action": [invoice.pk]}
    )

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID


def test_a_balance_that_rises_in_another_token_or_at_another_address_credits_nothing(client, chain, booking_data):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    other_order, _other_token = place(client, booking_data(lots="1"))
    other = current_invoice(other_order)
    payer = chain.accounts()[1]
    # Another allow-listed token to this invoice's address, its own token to another invoice's address, and native
    # coin to this address: all beyond what the scan's cursor read.
    dusdt = config.chain(CHAIN_ID).asset("dUSDT").contract
    assert dusdt != invoice.asset_contract
    chain.mint(dusdt, payer, 10**9, sender=payer, contract="NoReturnToken")
    chain.send_token(dusdt, invoice.deposit_address, 10**9, sender=payer, contract="NoReturnToken")
    pay_invoice(chain, other)
    chain.send_native(invoice.deposit_address, 10**18, sender=payer)
    chain.mine(3)
    cursor_past_the_head(chain)

    invoices.invoice_customer_paid(invoice=invoice)

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.native_checked_at is not None  # its balance was read
    assert invoice.status == Invoice.Status.NEW and invoice.amount_confirmed_units == 0
    assert order.status == OrderStatus.AWAITING_PAYMENT
    assert not Transfer.objects.filter(invoice=invoice).exists()
    assert not Transfer.objects.filter(to_address=invoice.deposit_address).exists()
    # The other invoice's customer did not say they paid: its address is not searched (the hash, or an operator's
    # re-check, are the way there).
    assert not Transfer.objects.filter(invoice=other).exists()


def test_the_search_for_a_missed_token_payment_is_bounded_and_asks_for_that_address_only(
    client, chain, booking_data, proxies, use_chains_file
):
    narrow = proxies(max_range=64)  # a provider stricter than the chains file says: ranges are halved
    use_chains_file(narrow.url)
    chain.mine(100)  # more blocks than the provider serves at once
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    tx_hash = pay_invoice(chain, invoice)
    chain.mine(3)
    cursor_past_the_head(chain)
    asked_before = len(narrow.log_queries)

    invoices.invoice_customer_paid(invoice=invoice)

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert Transfer.objects.get(invoice=invoice).tx_hash == tx_hash.lower()
    searched = narrow.log_queries[asked_before:]
    assert narrow.refused["range"] >= 1 and 1 <= len(searched) <= balances.LOG_SEARCH_CALLS
    recipient = "0x" + "0" * 24 + invoice.deposit_address.removeprefix("0x")
    assert all(query["address"] == [invoice.asset_contract] for query in searched)
    assert all(query["topics"][2] == recipient for query in searched)


@pytest.mark.parametrize("refusal", ["block range extends beyond current head block: head {head}", None])
def test_a_missed_token_payment_waits_for_a_lagging_logs_backend_then_is_credited(
    client, chain, booking_data, proxies, use_chains_file, refusal
):
    balanced = proxies(logs_lag=6, logs_lag_error=refusal)  # eth_getLogs reaches a backend 6 blocks behind
    use_chains_file(balanced.url)
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice)
    chain.mine(3)
    cursor_past_the_head(chain)

    invoices.invoice_customer_paid(invoice=invoice)

    # Its answer is not taken for "nothing there": the search runs again at the next cycle, not in ten minutes.
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.NEW and invoice.native_checked_at is None
    balanced.logs_lag = 0
    scan()
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID


def test_token_balances_are_read_through_multicall3_where_the_chains_file_names_it(
    client, chain, booking_data, proxies, settings, tmp_path
):
    multicall = chain.deploy("Multicall3", sender=chain.accounts()[3])
    counting = proxies()
    path = tmp_path / "chains.toml"
    path.write_text(
        chains_toml(counting.url).replace("confirmations = 3", f'confirmations = 3\nmulticall3 = "{multicall}"')
    )
    settings.PAYMENTS_CHAINS_FILE = str(path)
    assert config.chain(CHAIN_ID).multicall3 == multicall
    orders = [place(client, booking_data(lots="1"))[0] for _ in range(2)]
    paid, unpaid = (current_invoice(order) for order in orders)
    tx_hash = pay_invoice(chain, paid)
    chain.mine(3)
    cursor_past_the_head(chain)
    Invoice.objects.filter(pk=unpaid.pk).update(customer_paid_at=unpaid.created_at)  # also said they paid
    counting.reset_counts()

    invoices.invoice_customer_paid(invoice=paid)

    # Both balances in one eth_call: the unpaid one shows nothing to search, the paid one its transfer.
    assert counting.calls["eth_call"] == 1
    assert Invoice.objects.get(pk=unpaid.pk).native_checked_at is not None
    assert Invoice.objects.get(pk=paid.pk).status == Invoice.Status.SETTLED
    assert list(Transfer.objects.filter(invoice__in=[paid, unpaid]).values_list("tx_hash", flat=True)) == [
        tx_hash.lower()
    ]


def confirm_after_expiry(chain, invoice: Invoice) -> None:
    """The confirmations come in blocks dated after the expiry (reverted with the fixture's snapshot)."""
    chain.request("evm_setNextBlockTimestamp", [int((invoice.expires_at + timedelta(minutes=1)).timestamp())])
    chain.mine(3)


def test_a_contract_payment_ten_seconds_before_expiry_found_after_expiry_is_paid_on_time(client, chain, booking_data):
    order, invoice = pay_in_eth(client, booking_data)
    paid_block = forward_at(chain, invoice, timestamp=int(invoice.expires_at.timestamp()) - 10)
    # The scan runs only after the expiry, before that block is confirmed: nothing to see yet, the invoice expires.
    scan(now=invoice.expires_at + timedelta(seconds=30))
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.EXPIRED

    confirm_after_expiry(chain, invoice)
    scan(now=invoice.expires_at + timedelta(minutes=2))

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and not invoice.paid_late and not invoice.needs_operator
    assert order.status == OrderStatus.PAID
    credit = Transfer.objects.get(invoice=invoice)
    assert (credit.tx_hash, credit.block_number) == (f"balance:{invoice.deposit_address}:{paid_block}", paid_block)
    assert credit.amount_units == invoice.amount_due_units
    assert credit.block_time == invoice.expires_at.replace(microsecond=0) - timedelta(seconds=10)


def test_a_contract_payment_before_expiry_confirmed_after_it_is_dated_by_its_own_block(client, chain, booking_data):
    order, invoice = pay_in_eth(client, booking_data)
    paid_block = forward_at(chain, invoice, timestamp=int(invoice.expires_at.timestamp()) - 10)
    confirm_after_expiry(chain, invoice)

    # The first scan, after the expiry, reads the balance at a block dated after it.
    scan(now=invoice.expires_at + timedelta(minutes=2))

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and not invoice.paid_late
    assert order.status == OrderStatus.PAID
    assert Transfer.objects.get(invoice=invoice).block_number == paid_block


def test_a_contract_payment_after_expiry_is_judged_late(client, chain, booking_data):
    _order, invoice = pay_in_eth(client, booking_data)
    scan(now=invoice.expires_at + timedelta(seconds=30))
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.EXPIRED

    paid_block = forward_at(chain, invoice, timestamp=int(invoice.expires_at.timestamp()) + 20)
    chain.mine(3)
    scan(now=invoice.expires_at + timedelta(minutes=2))

    invoice.refresh_from_db()
    credit = Transfer.objects.get(invoice=invoice)
    assert credit.block_number == paid_block
    assert invoice.paid_late and invoice.amount_confirmed_units == invoice.amount_due_units


def test_a_direct_payment_the_cursor_missed_is_credited_under_its_own_hash_once(client, chain, booking_data):
    order, invoice = pay_in_eth(client, booking_data)
    tx_hash = pay_invoice(chain, invoice)  # a plain transfer to the address, in a block the cursor passes
    chain.mine(3)
    cursor_past_the_head(chain)

    scan()
    # The customer then pastes the hash: the payment is not counted a second time.
    invoices.invoice_customer_paid(invoice=invoice, tx_hint=tx_hash)

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and order.status == OrderStatus.PAID
    assert invoice.amount_confirmed_units == invoice.amount_due_units and not invoice.paid_over
    assert list(Transfer.objects.filter(invoice=invoice).values_list("tx_hash", "log_index")) == [(tx_hash, -1)]


def test_a_search_that_runs_out_of_round_trips_goes_on_below_where_it_stopped(
    client, chain, booking_data, anvil, settings, tmp_path
):
    """An old invoice on a fast chain: its payment lies further back than one search's round trips reach. The
    search is not marked done; the next cycles go on below where it stopped (never the same recent ranges again)
    until the payment is found, and the order settles dated by the payment's own block."""
    path = tmp_path / "narrow.toml"
    path.write_text(chains_toml(anvil.url).replace("max_block_range = 2000", "max_block_range = 8"))
    settings.PAYMENTS_CHAINS_FILE = str(path)
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    tx_hash = pay_invoice(chain, invoice)
    paid_block = int(chain.request("eth_getTransactionReceipt", [tx_hash])["blockNumber"], 16)
    chain.mine(balances.LOG_SEARCH_CALLS * 8 * 2 + 5)  # two searches' worth of ranges above the payment
    cursor_past_the_head(chain)
    invoices.invoice_customer_paid(invoice=invoice)  # the first search: ten ranges of 8 blocks, none reaching it
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.NEW and invoice.native_checked_at is None  # not done: read again

    for _cycle in range(3):
        scan()
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    credit = Transfer.objects.get(invoice=invoice)
    assert credit.tx_hash == tx_hash.lower() and credit.block_number == paid_block
