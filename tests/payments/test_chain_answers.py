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
