"""payments/chain_answers.py reads the chain's answers without web3, so the Transfer topic is written out there:
it must be the keccak of the event's signature, checked here with a second implementation (eth-utils)."""

from eth_utils import keccak

from payments.chain_answers import TRANSFER_TOPIC


def test_the_transfer_topic_is_the_keccak_of_the_erc20_transfer_event():
    assert "0x" + keccak(text="Transfer(address,address,uint256)").hex() == TRANSFER_TOPIC


def test_only_transactions_whose_receipt_says_success_are_kept_op_stack_deposits_included():
    import pytest

    from payments.chain_answers import successful_transactions

    paid, reverted, failed_deposit, deposit = ("0x" + digit * 64 for digit in "1234")
    receipts = [
        {"transactionHash": paid, "status": "0x1", "type": "0x2"},
        {"transactionHash": reverted, "status": "0x0", "type": "0x2"},
        # An OP-stack deposit whose value exceeded its sender's balance: included, failed, nothing moved.
        {"transactionHash": failed_deposit, "status": "0x0", "type": "0x7e"},
        {"transactionHash": deposit, "status": "0x1", "type": "0x7e"},
        {"transactionHash": "0x" + "9" * 64, "status": "0x1"},  # not asked about
        "garbage",
    ]
    wanted = frozenset({paid, reverted, failed_deposit, deposit})
    assert successful_transactions(receipts, wanted=wanted) == {paid, deposit}
    # A receipt without a status proves nothing; a missing receipt is the node's failure, the next URL is asked.
    assert successful_transactions([{"transactionHash": paid}], wanted=frozenset({paid})) == frozenset()
    with pytest.raises(ValueError):
        successful_transactions(receipts[:1], wanted=wanted)


def test_a_range_beyond_the_nodes_head_means_wait_and_providers_range_caps_mean_narrow():
    from payments.chain_answers import classify_error

    behind = [
        "block range extends beyond current head block: requested 21000100, head 21000000",
        "requested to block 50162452 after last accepted block 50162449",
        "block 50162452 is beyond the latest block 50162448 of this node, retry later",
        "invalid block range params",
    ]
    capped = [
        "eth_getLogs and eth_newFilter are limited to a 10,000 blocks range",  # QuickNode
        "maximum [from, to] blocks distance: 10000",  # Ankr
        "range 1000000 exceeds limit of 10000",  # Infura
        "You can make eth_getLogs requests with up to a 500 block range.",  # Alchemy
        "query returned more than 10000 results",
    ]
    assert [classify_error({"code": -32602, "message": m}, "eth_getLogs") for m in behind] == ["behind_head"] * 4
    assert [classify_error({"code": -32602, "message": m}, "eth_getLogs") for m in capped] == ["range_refused"] * 5


def _hex(data: bytes) -> str:
    return "0x" + data.hex()


def test_a_feed_round_is_read_with_its_signed_answer_decimals_and_description():
    from decimal import Decimal

    from eth_abi import encode

    from payments.chain_answers import parse_feed_round

    feed = parse_feed_round(
        code="0x6080",
        decimals=_hex(encode(["uint8"], [8])),
        latest_round=_hex(encode(["uint80", "int256", "uint256", "uint256", "uint80"], [7, -250_000_000, 1, 2, 7])),
        description=_hex(encode(["string"], ["ETH / USD"])),
    )

    assert (feed.rate, feed.round_id, feed.updated_at, feed.answered_in_round) == (Decimal("-2.5"), 7, 2, 7)
    assert feed.description == "ETH / USD" and feed.has_code


def test_a_hostile_feed_answer_is_an_unreadable_round_not_an_error():
    from eth_abi import encode

    from payments.chain_answers import parse_feed_round

    round_words = encode(["uint80", "int256", "uint256", "uint256", "uint80"], [7, 1, 1, 2, 7])
    eight = _hex(encode(["uint8"], [8]))
    for decimals, latest_round in [
        (_hex(encode(["uint8"], [200])), _hex(round_words)),  # more places than any price has
        ("0x" + "00" * 31, _hex(round_words)),  # a short word
        (eight, _hex(round_words[:-1])),  # a round cut short
        (eight, _hex(round_words + bytes(32))),  # longer than the five words
        (eight, _hex(b"\x01" + round_words[1:])),  # a round id wider than uint80
        (eight, "0xzz"),
        (eight, None),
    ]:
        feed = parse_feed_round(code="0x6080", decimals=decimals, latest_round=latest_round, description="0x")
        assert feed.has_code and feed.rate is None, (decimals, latest_round)
    assert not parse_feed_round(code="0x", decimals=eight, latest_round=_hex(round_words), description="").has_code


def test_a_description_is_short_text_or_nothing():
    from eth_abi import encode

    from payments.chain_answers import MAX_DESCRIPTION_BYTES, parse_abi_string

    longest = "x" * MAX_DESCRIPTION_BYTES
    assert parse_abi_string(_hex(encode(["string"], [longest]))) == longest
    assert parse_abi_string(_hex(encode(["bytes"], [b"\xffETH"]))) == "\ufffdETH"  # shown, never refused
    huge_length = (32).to_bytes(32, "big") + (2**255).to_bytes(32, "big") + bytes(32)
    for hostile in [
        _hex(encode(["string"], [longest + "x"])),  # one byte too many
        _hex(huge_length),
        _hex((2**200).to_bytes(32, "big") + bytes(64)),  # an offset far past the answer
        "0x" + "00" * 10_000,  # a long answer is not decoded at all
        "0x1",
        None,
        12,
    ]:
        assert parse_abi_string(hostile) == "", hostile
