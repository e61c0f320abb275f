"""payments/chain_answers.py reads the chain's answers without web3, so the Transfer topic is written out there:
it must be the keccak of the event's signature, checked here with a second implementation (eth-utils)."""

from eth_utils import keccak

from payments.chain_answers import TRANSFER_TOPIC


def test_the_transfer_topic_is_the_keccak_of_the_erc20_transfer_event():
    assert "0x" + keccak(text="Transfer(address,address,uint256)").hex() == TRANSFER_TOPIC
