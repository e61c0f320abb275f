"""The native coin is credited by what was paid, not by a balance that moves: a sweep between two payments or in
the same interval as one, a reorganisation under a native payment, a payment by an internal transaction from a
contract, a derived address that already holds coin (anvil)."""

import time

from booking.models import OrderStatus
from payments import balances, config, invoices
from payments.addresses import deposit_address
from payments.demo import pay_invoice
from payments.models import DerivationSlot, Invoice, Transfer
from tests.builders.orders import place
from tests.builders.payments import CHAIN_ID, crowd_invoices, pay_in_eth, scan


def sweep(chain, address: str) -> None:
    """The operator sweeps a deposit address (its key is offline; anvil lets the test send for it)."""
    chain.request("anvil_impersonateAccount", [address])
    balance = int(chain.request("eth_getBalance", [address, "latest"]), 16)
    chain.send_native(chain.accounts()[0], balance - 10**15, sender=address)
    chain.request("anvil_stopImpersonatingAccount", [address])


def test_a_sweep_between_two_partial_payments_hides_neither(client, chain, booking_data):
    order, invoice = pay_in_eth(client, booking_data)
    due = int(invoice.amount_due_units)
    pay_invoice(chain, invoice, units=due // 2)
    chain.mine(3)
    scan()

    sweep(chain, invoice.deposit_address)
    chain.mine(3)
    scan()

    pay_invoice(chain, invoice, units=due - due // 2)
    chain.mine(3)
    scan()

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and invoice.amount_confirmed_units == due
    assert order.status == OrderStatus.PAID


def test_a_sweep_and_a_payment_between_two_scans_do_not_cancel_out(client, chain, booking_data):
    order, invoice = pay_in_eth(client, booking_data)
    due = int(invoice.amount_due_units)
    first = pay_invoice(chain, invoice, units=due // 2)
    chain.mine(3)
    scan()

    # Between two scans: the deposit address is swept, then paid the rest (the balance ends about where it was).
    sweep(chain, invoice.deposit_address)
    second = pay_invoice(chain, invoice, units=due - due // 2)
    chain.mine(3)
    scan()

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and invoice.amount_confirmed_units == due
    assert not invoice.paid_over and order.status == OrderStatus.PAID
    credits = Transfer.objects.filter(invoice=invoice).order_by("block_number")
    assert [(credit.tx_hash, credit.log_index) for credit in credits] == [(first.lower(), -1), (second.lower(), -1)]


def test_a_native_payment_removed_by_a_reorganisation_is_taken_back_and_a_later_one_credited(
    client, chain, booking_data
):
    order, invoice = pay_in_eth(client, booking_data)
    before = chain.snapshot()
    pay_invoice(chain, invoice)
    scan()
    order.refresh_from_db()
    assert order.status == OrderStatus.PAYMENT_PROCESSING
    assert Transfer.objects.get(invoice=invoice).status == Transfer.Status.SEEN

    chain.revert(before)  # the block with the payment is gone ...
    chain.mine(4)  # ... and the chain moves on without it
    scan()

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert Transfer.objects.get(invoice=invoice).status == Transfer.Status.REMOVED
    assert invoice.status == Invoice.Status.NEW and invoice.amount_pending_units == 0
    assert order.status == OrderStatus.AWAITING_PAYMENT

    pay_invoice(chain, invoice)  # paid again, for good
    chain.mine(3)
    scan()

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and not invoice.paid_over
    assert order.status == OrderStatus.PAID
    chain.snapshot()  # the fixture reverts to its own snapshot afterwards


def test_a_payment_by_an_internal_transaction_from_a_contract_is_credited(client, chain, booking_data):
    order, invoice = pay_in_eth(client, booking_data)
    payer = chain.accounts()[2]
    forwarder = chain.deploy("PaymentForwarder", sender=payer)
    amount = int(invoice.amount_due_units)
    chain.call("PaymentForwarder", forwarder, "forward", invoice.deposit_address, sender=payer, value=amount)
    chain.mine(3)

    scan()

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    credit = Transfer.objects.get(invoice=invoice)
    assert credit.amount_units == invoice.amount_due_units and credit.block_time is not None


def test_a_payment_by_a_contract_is_found_at_once_among_many_after_i_have_paid(client, chain, booking_data):
    """Balances are reconciled a bounded number a cycle; the customer's "I've paid" puts theirs first."""
    order, invoice = pay_in_eth(client, booking_data)
    crowd_invoices(invoice, 3 * balances.NATIVE_BALANCE_CHECKS_PER_CYCLE)
    assert scan().balance_checks == balances.NATIVE_BALANCE_CHECKS_PER_CYCLE
    payer = chain.accounts()[2]
    forwarder = chain.deploy("PaymentForwarder", sender=payer)
    chain.call(
        "PaymentForwarder",
        forwarder,
        "forward",
        invoice.deposit_address,
        sender=payer,
        value=int(invoice.amount_due_units),
    )
    chain.mine(3)
    assert Invoice.objects.get(pk=invoice.pk).native_checked_at is not None  # read in the first round

    invoices.invoice_customer_paid(invoice=invoice)  # the check it asks for runs here (eager Celery)

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert Transfer.objects.get(invoice=invoice).tx_hash.startswith("balance:")


def test_a_derived_address_that_already_holds_coin_is_never_issued(client, chain, booking_data, caplog):
    order, _token = place(client, booking_data(lots="1"))
    next_index = DerivationSlot.objects.order_by("-pk").first().pk + 1
    prefunded = deposit_address(config.account_xpub(), next_index).lower()
    chain.send_native(prefunded, 10**18, sender=chain.accounts()[3])  # someone funds it first

    invoice = invoices.invoice_change_asset(order=order, asset_key=f"{CHAIN_ID}:ETH")

    assert invoice.deposit_address != prefunded and invoice.derivation_index > next_index
    assert f"derivation index {next_index} ({deposit_address(config.account_xpub(), next_index)})" in caplog.text
    assert not Invoice.objects.filter(deposit_address=prefunded).exists()


def send_reverting_payment(chain, to: str, value: int) -> dict:
    """Send `value` to `to` and wait for the receipt, whatever its status (DevChain refuses reverted ones)."""
    tx_hash = chain.request(
        "eth_sendTransaction", [{"from": chain.accounts()[1], "to": to, "value": hex(value), "gas": hex(100_000)}]
    )
    for _ in range(200):
        if receipt := chain.request("eth_getTransactionReceipt", [tx_hash]):
            return receipt
        time.sleep(0.05)
    raise RuntimeError(f"transaction {tx_hash} not mined")


def test_a_reverted_transfer_to_a_deposit_address_is_never_credited(client, chain, booking_data):
    # given: code at the deposit address that reverts whatever it is sent (PUSH1 0 PUSH1 0 REVERT)
    order, invoice = pay_in_eth(client, booking_data)
    chain.request("anvil_setCode", [invoice.deposit_address, "0x60006000fd"])

    # when: the whole amount due is sent there, and the transaction is included but fails
    receipt = send_reverting_payment(chain, invoice.deposit_address, int(invoice.amount_due_units))
    assert receipt["status"] == "0x0"
    chain.mine(3)
    scan()
    chain.mine(3)
    scan()

    # then: nothing is credited, the order still waits for its payment
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert order.status == OrderStatus.AWAITING_PAYMENT
    assert invoice.amount_confirmed_units == 0 and invoice.amount_pending_units == 0
    assert not Transfer.objects.filter(invoice=invoice).exists()

    # and a transfer that succeeds (the code gone) is credited as before
    chain.request("anvil_setCode", [invoice.deposit_address, "0x"])
    pay_invoice(chain, invoice)
    chain.mine(3)
    scan()
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID


def test_receipts_are_read_per_transaction_where_the_node_lacks_block_receipts(
    client, chain, booking_data, proxies, use_chains_file
):
    old_node = proxies(unknown_methods=frozenset({"eth_getBlockReceipts"}))
    use_chains_file(old_node.url)
    _order, invoice = pay_in_eth(client, booking_data)
    chain.request("anvil_setCode", [invoice.deposit_address, "0x60006000fd"])
    assert send_reverting_payment(chain, invoice.deposit_address, int(invoice.amount_due_units))["status"] == "0x0"
    chain.request("anvil_setCode", [invoice.deposit_address, "0x"])
    paid = pay_invoice(chain, invoice, units=int(invoice.amount_due_units) // 2)
    chain.mine(3)

    scan()

    credits = Transfer.objects.filter(invoice=invoice)
    assert [credit.tx_hash for credit in credits] == [paid.lower()]
    assert old_node.calls["eth_getTransactionReceipt"] >= 2 and old_node.refused["unknown method"] >= 1
