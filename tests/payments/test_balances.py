"""The balance safety net (payments/balances.py), on anvil: native coin paid by a contract shortly before expiry
is credited as paid on time, even when the scan only runs after the expiry."""

from datetime import timedelta

from booking.models import OrderStatus
from payments import scanner
from payments.models import Invoice, Transfer
from tests.payments.test_native import pay_in_eth

CHAIN_ID = 31337


def scan(**kwargs) -> scanner.ScanResult:
    return scanner.chain_scan(chain_id=CHAIN_ID, **kwargs)


# --- native coin paid by a contract near expiry --------------------------------------------------------------------
def forward_at(chain, invoice: Invoice, *, timestamp: int) -> int:
    """A contract pays the invoice's due amount on to its address (an internal transaction, no log), in a block
    whose time is `timestamp`. Returns that block's number."""
    payer = chain.accounts()[2]
    forwarder = chain.deploy("PaymentForwarder", sender=payer)
    chain.request("evm_setNextBlockTimestamp", [timestamp])
    receipt = chain.call(
        "PaymentForwarder",
        forwarder,
        "forward",
        invoice.deposit_address,
        sender=payer,
        value=int(invoice.amount_due_units),
    )
    block = int(receipt["blockNumber"], 16)
    assert int(chain.request("eth_getBlockByNumber", [hex(block), False])["timestamp"], 16) == timestamp
    return block


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
