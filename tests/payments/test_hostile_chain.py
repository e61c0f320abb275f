"""The chain is hostile input: anyone can deploy a contract that emits Transfer-shaped logs to a deposit address,
for a cent. No log can stop the scan, and an honest payment is still credited (anvil, PostgreSQL).

HostileEmitter (payments/contracts) emits what no honest token would. Deployed by the test, it is either a
stranger (not allow-listed: the node never returns its logs) or, to reach the parser, allow-listed as `dHOST`."""

import time

from booking.models import OrderStatus
from payments import services
from payments.chain import TRANSFER_TOPIC
from payments.demo import pay_invoice
from payments.models import ChainCursor, Invoice, Transfer
from payments.selectors import current_invoice
from tests.booking.test_pages import place

CHAIN_ID = 31337


def deploy_hostile(chain) -> str:
    return chain.deploy("HostileEmitter", sender=chain.accounts()[5])


def allow_list(use_chains_file, chain, contract: str) -> None:
    """The hostile contract as an allow-listed token: its logs reach the scanner's parser."""
    use_chains_file(
        chain.chain.rpc_urls[0],
        extra_assets=f'\n  [[chains.assets]]\n  symbol = "dHOST"\n  contract = "{contract}"\n  decimals = 6\n'
        '  pegged_to = "EUR"\n',
        name="hostile",
    )


def topic(address: str) -> bytes:
    return bytes(12) + bytes.fromhex(address.removeprefix("0x"))


def scan() -> services.ScanResult:
    return services.chain_scan(chain_id=CHAIN_ID)


def test_a_64_byte_amount_from_a_stranger_contract_stops_nothing_and_later_payments_are_credited(
    client, chain, booking_data
):
    """Regression: this log made every later scan fail with `numeric field overflow`; the cursor never moved."""
    victim, _ = place(client, booking_data(lots="1"))
    hostile = deploy_hostile(chain)
    attacker = chain.accounts()[5]
    chain.call(
        "HostileEmitter",
        hostile,
        "transferWithData",
        current_invoice(victim).deposit_address,
        (2**256 - 1).to_bytes(32, "big") * 2,
        sender=attacker,
    )
    chain.mine(3)
    first = scan()

    honest, _ = place(client, booking_data(lots="1", contact_email="honest@example.org"))
    pay_invoice(chain, current_invoice(honest))
    chain.mine(2)
    second = scan()

    honest.refresh_from_db()
    assert honest.status == OrderStatus.PAID
    assert not Transfer.objects.filter(token_contract=hostile).exists()
    assert ChainCursor.objects.get(chain_id=CHAIN_ID).confirmed_block == second.confirmed > first.confirmed


def test_malformed_transfer_logs_of_an_allow_listed_contract_are_skipped_and_counted(
    client, chain, booking_data, use_chains_file
):
    hostile = deploy_hostile(chain)
    allow_list(use_chains_file, chain, hostile)
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    attacker, to = chain.accounts()[5], invoice.deposit_address
    word = (1000_000000).to_bytes(32, "big")
    transfer_topic = bytes.fromhex(TRANSFER_TOPIC.removeprefix("0x"))
    malformed = [
        ("transferWithData", to, word * 2),  # a 64-byte amount
        ("transferWithData", to, b""),  # no amount at all
        ("transferWithData", to, word[:31]),  # 31 bytes
        ("transferWithData", to, (2**255).to_bytes(32, "big")),  # an amount no token holds
        ("transferWithData", to, bytes(32)),  # zero
        ("rawLog", [transfer_topic, topic(attacker)], word),  # the recipient topic missing
        ("rawLog", [transfer_topic, topic(attacker), topic(to), topic(to)], word),  # an extra topic (ERC-721 shape)
        ("rawLog", [transfer_topic, topic(attacker), b"\xff" * 12 + topic(to)[12:]], word),  # not an address
    ]
    for function, *args in malformed:
        chain.call("HostileEmitter", hostile, function, *args, sender=attacker)
    pay_invoice(chain, invoice)  # and the honest payment, after them
    chain.mine(3)

    result = scan()

    order.refresh_from_db()
    invoice.refresh_from_db()
    assert order.status == OrderStatus.PAID and invoice.amount_confirmed_units == invoice.amount_due_units
    assert result.skipped_logs == len(malformed)
    assert ChainCursor.objects.get(chain_id=CHAIN_ID).skipped_logs == len(malformed)
    assert list(Transfer.objects.values_list("token_contract", flat=True)) == [invoice.asset_contract]


def test_a_block_of_5000_spam_logs_costs_nothing_to_an_honest_payment(client, chain, booking_data, use_chains_file):
    hostile = deploy_hostile(chain)
    allow_list(use_chains_file, chain, hostile)
    order, _ = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    spammer = chain.accounts()[5]
    # 5,000 well-formed transfers of the allow-listed contract to 5,000 addresses, one of them the deposit address
    chain.call("HostileEmitter", hostile, "spam", "0x" + "00" * 19 + "01", 4999, 1, sender=spammer, gas=25_000_000)
    chain.call("HostileEmitter", hostile, "spam", invoice.deposit_address, 1, 1, sender=spammer)
    pay_invoice(chain, invoice)
    chain.mine(2)

    started = time.perf_counter()
    result = scan()
    elapsed = time.perf_counter() - started

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert result.logs == 2  # the spam to the deposit address (a wrong asset) and the payment
    assert Transfer.objects.get(token_contract=hostile).wrong_asset
    assert Invoice.objects.get(pk=invoice.pk).amount_confirmed_units == invoice.amount_due_units
    assert elapsed < 2, f"a scan through 5,000 spam logs took {elapsed:.2f} s"
