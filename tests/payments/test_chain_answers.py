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
