"""A hostile token contract on the dev chain, and transactions mined in one block."""


def deploy_hostile(chain) -> str:
    return chain.deploy("HostileEmitter", sender=chain.accounts()[5])


def in_one_block(chain, transactions: list[dict]) -> None:
    """Mine `transactions` (sent from anvil's unlocked accounts) together in one block."""
    chain.request("evm_setAutomine", [False])
    try:
        hashes = [chain.request("eth_sendTransaction", [transaction]) for transaction in transactions]
        chain.mine(1)
    finally:
        chain.request("evm_setAutomine", [True])
    receipts = [chain.request("eth_getTransactionReceipt", [tx_hash]) for tx_hash in hashes]
    assert len({receipt["blockNumber"] for receipt in receipts}) == 1
    assert all(int(receipt["status"], 16) == 1 for receipt in receipts)
