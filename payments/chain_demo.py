"""`DevChain` adds what the demo and the tests do on a local development chain (anvil) to the chain adapter
(`payments/chain.py`): deploy the project's own contracts, mint, transfer from an unlocked account, mine. It sends
transactions from the node's unlocked accounts: no private key is handled here either. It imports no web3: the
adapter encodes its contracts' calls (web3 lives in payments/chain.py only).
"""

import json
import time
from pathlib import Path

from payments.chain import ChainClient, checksum, contract_call_data, contract_deploy_data, is_address

CONTRACTS_DIR = Path(__file__).resolve().parent / "contracts" / "build"


class DevChain(ChainClient):
    """Development chain helpers (anvil): unlocked accounts sign; used by the demo and the tests."""

    def accounts(self) -> list[str]:
        return [account.lower() for account in self.request("eth_accounts", [])]

    def _transact(self, sender: str, transaction: dict) -> str:
        tx_hash = self.request("eth_sendTransaction", [{"from": sender, **transaction}])
        for _ in range(200):
            receipt = self.request("eth_getTransactionReceipt", [tx_hash])
            if receipt:
                if int(receipt["status"], 16) != 1:
                    raise RuntimeError(f"transaction {tx_hash} reverted")
                return receipt
            time.sleep(0.05)
        raise RuntimeError(f"transaction {tx_hash} not mined")

    @staticmethod
    def artifact(name: str) -> dict:
        return json.loads((CONTRACTS_DIR / f"{name}.json").read_text())

    def deploy(self, name: str, *args, sender: str) -> str:
        artifact = self.artifact(name)
        data = contract_deploy_data(artifact["abi"], artifact["bytecode"], *args)
        receipt = self._transact(sender, {"data": data})
        return receipt["contractAddress"].lower()

    def _call_data(self, name: str, function: str, *args) -> str:
        return contract_call_data(self.artifact(name)["abi"], function, *args)

    def mint(self, token: str, to: str, amount: int, *, sender: str, contract: str = "DemoStablecoin") -> str:
        receipt = self._transact(sender, {"to": token, "data": self._call_data(contract, "mint", checksum(to), amount)})
        return receipt["transactionHash"]

    def send_token(self, token: str, to: str, amount: int, *, sender: str, contract: str = "DemoStablecoin") -> dict:
        data = self._call_data(contract, "transfer", checksum(to), amount)
        return self._transact(sender, {"to": token, "data": data})

    def send_native(self, to: str, value: int, *, sender: str) -> dict:
        return self._transact(sender, {"to": to, "value": hex(value)})

    def call(
        self, contract: str, address: str, function: str, *args, sender: str, gas: int | None = None, value: int = 0
    ) -> dict:
        """Send a transaction calling `function` of the deployed `contract` (an artefact name) at `address`, with
        `value` wei attached."""
        args = [checksum(arg) if isinstance(arg, str) and is_address(arg) else arg for arg in args]
        transaction = {"to": address, "data": self._call_data(contract, function, *args)}
        if gas:
            transaction["gas"] = hex(gas)
        if value:
            transaction["value"] = hex(value)
        return self._transact(sender, transaction)

    def set_rate(self, feed: str, answer: int, *, sender: str) -> None:
        # An explicit gas limit: anvil's estimate for this call can come out short (seen in the tests: the
        # transaction reverted out of gas, its gas used equal to the estimate).
        data = self._call_data("MockAggregator", "setAnswer", answer)
        self._transact(sender, {"to": feed, "data": data, "gas": hex(200_000)})

    def mine(self, blocks: int = 1) -> None:
        self.request("anvil_mine", [hex(blocks)])

    def snapshot(self) -> str:
        return self.request("evm_snapshot", [])

    def revert(self, snapshot_id: str) -> None:
        self.request("evm_revert", [snapshot_id])

    def balance_of(self, token: str, owner: str) -> int:
        data = self._call_data("DemoStablecoin", "balanceOf", checksum(owner))
        return int(self.request("eth_call", [{"to": token, "data": data}, "latest"]), 16)
