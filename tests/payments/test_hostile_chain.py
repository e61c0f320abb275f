"""The chain is hostile input: anyone can deploy a contract that emits Transfer-shaped logs to a deposit address,
for a cent. No log can stop the scan, and an honest payment is still credited (anvil, PostgreSQL).

HostileEmitter (payments/contracts) emits what no honest token would. Deployed by the test, it is either a
stranger (not allow-listed: the node never returns its logs) or, to reach the parser, allow-listed as `dHOST`. A
block can also hold more logs than a provider returns at once."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from booking.models import OrderStatus
from payments import invoices, scanner
from payments.chain import checksum
from payments.chain_answers import TRANSFER_TOPIC, parse_block
from payments.demo import pay_invoice
from payments.models import ChainCursor, Invoice, Transfer
from payments.selectors import current_invoice
from tests.builders.hostile_chain import deploy_hostile, in_one_block
from tests.builders.orders import place
from tests.builders.payments import crowd_invoices

CHAIN_ID = 31337


def allow_list(use_chains_file, chain, contract: str, *, rpc_url: str = "") -> None:
    """The hostile contract as an allow-listed token: its logs reach the scanner's parser."""
    use_chains_file(
        rpc_url or chain.chain.rpc_urls[0],
        extra_assets=f'\n  [[chains.assets]]\n  symbol = "dHOST"\n  contract = "{contract}"\n  decimals = 6\n'
        '  pegged_to = "EUR"\n',
        name="hostile",
    )


def topic(address: str) -> bytes:
    return bytes(12) + bytes.fromhex(address.removeprefix("0x"))


def scan() -> scanner.ScanResult:
    return scanner.chain_scan(chain_id=CHAIN_ID)


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


def test_a_block_of_5000_spam_logs_costs_nothing_to_an_honest_payment(
    client, chain, booking_data, proxies, use_chains_file
):
    """A scan through a block of 5,000 spam transfers of an allow-listed token, one of them to a deposit address,
    costs what a scan through that one spam transfer costs: the same calls to the node (the 5,000 logs come back in
    the same answers, over 3 MB of them) and no more queries (none for a log to an address that is no invoice's);
    and the honest payment in the block is credited. The detection latency is bench/chain_scan.py's figure."""
    hostile = deploy_hostile(chain)
    node = proxies()
    allow_list(use_chains_file, chain, hostile, rpc_url=node.url)
    spammer = chain.accounts()[5]
    first, _ = place(client, booking_data(lots="1", contact_email="first@example.org"))
    order, _ = place(client, booking_data(lots="1"))
    place(client, booking_data(lots="1", contact_email="waiting@example.org"))  # open throughout
    scan()

    def spam_pay_and_scan(invoice, strangers: int) -> tuple[scanner.ScanResult, tuple[int, int]]:
        if strangers:  # well-formed transfers to as many addresses, none of them a deposit address
            chain.call(
                "HostileEmitter", hostile, "spam", "0x" + "00" * 19 + "01", strangers, 1, sender=spammer, gas=25_000_000
            )
        chain.call("HostileEmitter", hostile, "spam", invoice.deposit_address, 1, 1, sender=spammer)
        pay_invoice(chain, invoice)
        chain.mine(2)
        node.reset_counts()
        with CaptureQueriesContext(connection) as queries:
            result = scan()
        return result, (node.requests, len(queries))

    _, (calls, queried) = spam_pay_and_scan(current_invoice(first), strangers=0)
    invoice = current_invoice(order)
    result, (spam_calls, spam_queried) = spam_pay_and_scan(invoice, strangers=4999)

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert result.logs == 2  # the spam to the deposit address (a wrong asset) and the payment
    assert Transfer.objects.get(token_contract=hostile, to_address=invoice.deposit_address).wrong_asset
    assert Invoice.objects.get(pk=invoice.pk).amount_confirmed_units == invoice.amount_due_units
    assert spam_calls == calls and spam_queried <= queried, ((spam_calls, spam_queried), (calls, queried))


def token_payment(chain, invoice: Invoice) -> dict:
    """The transaction that pays `invoice` in its token, from a payer minted what is due, to send in a block."""
    payer, due = chain.accounts()[1], int(invoice.amount_due_units)
    chain.mint(invoice.asset_contract, payer, due, sender=payer)
    data = chain._call_data("DemoStablecoin", "transfer", checksum(invoice.deposit_address), due)
    return {"from": payer, "to": invoice.asset_contract, "gas": hex(200_000), "data": data}


def test_a_block_with_more_logs_than_the_provider_returns_still_credits_the_payments_in_it(
    client, chain, booking_data, proxies, use_chains_file
):
    """A provider answers at most `max_logs` logs (10,000 at geth's defaults; 1,000 here, to keep the block small):
    the block is read per contract, then by the watched recipients (more than 998 of them: two requests, each within
    the 1,000-topic cap), and the scan moves past it."""
    strict = proxies(max_range=2000, max_logs=1000)
    hostile = deploy_hostile(chain)
    allow_list(use_chains_file, chain, hostile, rpc_url=strict.url)
    in_token, _ = place(client, booking_data(lots="1"))
    in_spammed, _ = place(client, booking_data(lots="1", contact_email="spammed@example.org"))
    token_invoice = current_invoice(in_token)
    spammed_invoice = invoices.invoice_change_asset(order=in_spammed, asset_key=f"{CHAIN_ID}:dHOST")
    crowd_invoices(token_invoice, 1200)  # more watched addresses than one filter may name
    spammer = chain.accounts()[5]
    in_one_block(
        chain,
        [
            # 1,500 logs of the allow-listed dHOST to strangers, ...
            {
                "from": spammer,
                "to": hostile,
                "gas": hex(15_000_000),
                "data": chain._call_data("HostileEmitter", "spam", "0x" + "00" * 19 + "01", 1500, 1),
            },
            # ... the payment in dHOST of one order among them, ...
            {
                "from": spammer,
                "to": hostile,
                "gas": hex(200_000),
                "data": chain._call_data(
                    "HostileEmitter",
                    "spam",
                    checksum(spammed_invoice.deposit_address),
                    1,
                    int(spammed_invoice.amount_due_units),
                ),
            },
            # ... and an honest payment in another token, in the same block.
            token_payment(chain, token_invoice),
        ],
    )
    chain.mine(2)

    result = scan()

    in_token.refresh_from_db()
    in_spammed.refresh_from_db()
    assert in_token.status == OrderStatus.PAID and in_spammed.status == OrderStatus.PAID
    assert result.unread == 0 and result.logs == 2
    assert ChainCursor.objects.get(chain_id=CHAIN_ID).confirmed_block == result.confirmed
    assert strict.refused["too many results"] >= 2 and "too many topics" not in strict.refused
    filtered = [query for query in strict.log_queries if len(query["topics"]) == 3]
    assert len(filtered) == 2 and all(len(query["topics"][2]) <= 998 for query in filtered)


def test_an_address_flooded_beyond_the_providers_cap_in_one_block_is_logged_and_the_scan_moves_on(
    client, chain, booking_data, proxies, use_chains_file, caplog
):
    """The last resort: more transfers of one contract to one watched address in one block than the provider
    returns (2 here). That address's logs of that block stay unread, with an error; every other payment in the block
    is credited and the cursor passes it."""
    strict = proxies(max_range=2000, max_logs=2)
    hostile = deploy_hostile(chain)
    allow_list(use_chains_file, chain, hostile, rpc_url=strict.url)
    flooded, _ = place(client, booking_data(lots="1", contact_email="flooded@example.org"))
    honest, _ = place(client, booking_data(lots="1"))
    target, invoice = current_invoice(flooded).deposit_address, current_invoice(honest)
    flood = chain._call_data("HostileEmitter", "transferWithData", checksum(target), (1).to_bytes(32, "big"))
    spam = {"from": chain.accounts()[5], "to": hostile, "gas": hex(100_000), "data": flood}
    in_one_block(chain, [spam] * 3 + [token_payment(chain, invoice)])
    chain.mine(2)

    result = scan()

    honest.refresh_from_db()
    assert honest.status == OrderStatus.PAID
    assert result.unread == 1 and "than the provider returns: not read" in caplog.text
    assert ChainCursor.objects.get(chain_id=CHAIN_ID).confirmed_block == result.confirmed


def test_transactions_to_a_deposit_address_that_are_not_well_formed_are_skipped_and_counted():
    deposit, stranger = "0x" + "11" * 20, "0x" + "22" * 20
    good = {"hash": "0x" + "aa" * 32, "from": stranger, "to": deposit, "value": hex(10**18)}
    block = {
        "number": "0x10",
        "hash": "0x" + "bb" * 32,
        "timestamp": "0x5",
        "transactions": [
            good,
            {**good, "to": stranger},  # not ours: not looked at
            {**good, "to": None},  # a contract creation
            {**good, "value": "0x0"},  # pays nothing
            {**good, "value": hex(2**200)},  # more than any coin's supply
            {**good, "value": "1e18"},  # not a quantity
            {**good, "hash": "0x1234"},
            {**good, "from": None},
        ],
    }

    read = parse_block(block, number=16, recipients=frozenset({deposit}))

    assert read.blocks == {16: ("0x" + "bb" * 32, 5)} and read.skipped == 4
    assert [(transfer.tx_hash, transfer.log_index, transfer.amount) for transfer in read.transfers] == [
        ("0x" + "aa" * 32, -1, 10**18)
    ]
    for answer in (None, {**block, "number": "0x11"}, {**block, "transactions": ["0x" + "aa" * 32]}):
        with pytest.raises(ValueError):  # that URL failed: the next one is asked
            parse_block(answer, number=16, recipients=frozenset({deposit}))
