"""The chain adapter: the only module that imports web3.

`ChainClient` reads what the scanner needs, in a fixed number of round trips whatever the number of invoices:
the head, the confirmed block, ERC-20 Transfer logs to a set of deposit addresses, native balances (one batched
request), block hashes (one batched request). It rotates to the next RPC URL when one fails, backs off when
rate-limited, shrinks an eth_getLogs range that a provider refuses, and raises `ChainUnavailable` when nothing
answers. Every round trip is counted (`calls`), for bench/chain_scan.py.

`DevChain` adds what the demo and the tests do on a local development chain (anvil): deploy the project's own
contracts, mint, transfer from an unlocked account, mine. It sends transactions from the node's unlocked
accounts: no private key is handled here either.
"""

import json
import logging
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import requests
from web3 import Web3
from web3.providers.rpc import HTTPProvider

from payments.config import Chain

logger = logging.getLogger(__name__)


def _keccak_hex(text: str) -> str:
    return "0x" + Web3.keccak(text=text).hex().removeprefix("0x")


TRANSFER_TOPIC = _keccak_hex("Transfer(address,address,uint256)")
CONTRACTS_DIR = Path(__file__).resolve().parent / "contracts" / "build"
_RANGE_REFUSALS = ("range", "limit", "too many", "more than", "exceed", "response size")


class ChainUnavailable(Exception):
    """No RPC URL of the chain answered usefully. Nothing was changed; try again later."""


class RangeRefused(Exception):
    pass


class RpcError(Exception):
    def __init__(self, error: dict) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.error = error


@dataclass(frozen=True)
class TransferLog:
    tx_hash: str
    log_index: int
    block_number: int
    block_hash: str
    token: str  # lower-case contract address
    sender: str  # lower-case
    recipient: str  # lower-case
    amount: int


def _topic_for(address: str) -> str:
    return "0x" + "0" * 24 + address.lower().removeprefix("0x")


def _address_from_topic(topic: str) -> str:
    return "0x" + topic[-40:].lower()


def _hex(value) -> str:
    return value.hex() if hasattr(value, "hex") and not isinstance(value, str) else str(value)


class ChainClient:
    def __init__(self, chain: Chain, *, timeout: float = 5.0, backoff: float = 0.25) -> None:
        self.chain = chain
        self.calls = 0
        self.backoff = backoff
        self._providers = [
            HTTPProvider(url, request_kwargs={"timeout": timeout}, exception_retry_configuration=None)
            for url in chain.rpc_urls
        ]
        self._preferred = 0

    # --- transport: failover, backoff, one counted round trip per call ----------------------------------------
    def _send(self, send) -> object:
        errors = []
        count = len(self._providers)
        for attempt in range(count):
            index = (self._preferred + attempt) % count
            provider = self._providers[index]
            self.calls += 1
            try:
                result = send(provider)
            except requests.HTTPError as exc:
                status = exc.response.status_code if exc.response is not None else None
                errors.append(f"{provider.endpoint_uri}: HTTP {status}")
                if status == 429:  # rate-limited: give the provider a moment, then the next URL
                    time.sleep(self.backoff * (attempt + 1))
                continue
            except (requests.ConnectionError, requests.Timeout, ValueError, OSError) as exc:
                errors.append(f"{provider.endpoint_uri}: {type(exc).__name__}")
                continue
            except RpcError as exc:
                message = str(exc.error.get("message", "")).lower()
                if any(word in message for word in _RANGE_REFUSALS):
                    raise RangeRefused(message) from exc
                errors.append(f"{provider.endpoint_uri}: {exc}")
                continue
            self._preferred = index
            return result
        raise ChainUnavailable(f"chain {self.chain.chain_id}: " + "; ".join(errors))

    def request(self, method: str, params: list) -> object:
        def send(provider):
            response = provider.make_request(method, params)
            if response.get("error"):
                raise RpcError(response["error"])
            return response["result"]

        return self._send(send)

    def batch(self, requests_: list[tuple[str, list]]) -> list:
        if not requests_:
            return []

        def send(provider):
            responses = provider.make_batch_request(requests_)
            if not isinstance(responses, list):
                raise RpcError(responses.get("error") or {"message": "batch refused"})
            for response in responses:
                if response.get("error"):
                    raise RpcError(response["error"])
            return [response["result"] for response in responses]

        return self._send(send)

    # --- reads ---------------------------------------------------------------------------------------------
    def head(self) -> int:
        return int(self.request("eth_blockNumber", []), 16)

    def confirmed_block(self, head: int) -> int:
        """The newest block considered final: the node's `finalized` tag, or head − confirmations + 1."""
        if self.chain.finality == "finalized":
            block = self.request("eth_getBlockByNumber", ["finalized", False])
            return int(block["number"], 16)
        return max(0, head - self.chain.confirmations + 1)

    def transfer_logs(self, *, from_block: int, to_block: int, recipients: list[str]) -> list[TransferLog]:
        """ERC-20 Transfer logs of any contract to the recipients, in [from_block, to_block]."""
        if not recipients or from_block > to_block:
            return []
        topics = [TRANSFER_TOPIC, None, [_topic_for(address) for address in recipients]]
        logs: list[TransferLog] = []
        start, span = from_block, max(1, self.chain.max_block_range)
        while start <= to_block:
            end = min(to_block, start + span - 1)
            try:
                raw = self.request("eth_getLogs", [{"fromBlock": hex(start), "toBlock": hex(end), "topics": topics}])
            except RangeRefused:
                if span == 1:
                    raise ChainUnavailable(f"chain {self.chain.chain_id}: getLogs refused a single block") from None
                span = max(1, span // 2)
                continue
            logs.extend(self._parse_log(entry) for entry in raw if len(entry.get("topics", [])) == 3)
            start = end + 1
        return logs

    @staticmethod
    def _parse_log(entry: dict) -> TransferLog:
        data = entry.get("data") or "0x"
        return TransferLog(
            tx_hash=entry["transactionHash"].lower(),
            log_index=int(entry["logIndex"], 16),
            block_number=int(entry["blockNumber"], 16),
            block_hash=entry["blockHash"].lower(),
            token=entry["address"].lower(),
            sender=_address_from_topic(entry["topics"][1]),
            recipient=_address_from_topic(entry["topics"][2]),
            amount=int(data, 16) if data not in ("0x", "") else 0,
        )

    def balances(self, queries: list[tuple[str, int | str]]) -> list[int]:
        """Native balances for (address, block) pairs, in one batched round trip."""
        results = self.batch(
            [
                ("eth_getBalance", [address, hex(block) if isinstance(block, int) else block])
                for address, block in queries
            ]
        )
        return [int(result, 16) for result in results]

    def block_hashes(self, numbers: list[int]) -> dict[int, str]:
        """The canonical hash of each block, in one batched round trip."""
        wanted = sorted(set(numbers))
        results = self.batch([("eth_getBlockByNumber", [hex(number), False]) for number in wanted])
        return {number: (block or {}).get("hash", "").lower() for number, block in zip(wanted, results, strict=True)}

    def aggregator_rate(self, feed: str) -> tuple[Decimal, int]:
        """A Chainlink-style aggregator's latest answer (as a Decimal) and its update time (unix seconds)."""
        decimals_call = {"to": feed, "data": _keccak_hex("decimals()")[:10]}
        round_call = {"to": feed, "data": _keccak_hex("latestRoundData()")[:10]}
        decimals_raw, round_raw = self.batch(
            [("eth_call", [decimals_call, "latest"]), ("eth_call", [round_call, "latest"])]
        )
        decimals = int(decimals_raw, 16)
        words = [round_raw[2 + 64 * index : 2 + 64 * (index + 1)] for index in range(5)]
        answer = int(words[1], 16)
        if answer >= 2**255:
            answer -= 2**256
        if answer <= 0:
            raise ChainUnavailable(f"rate feed {feed} answered {answer}")
        return Decimal(answer).scaleb(-decimals), int(words[3], 16)


def checksum(address: str) -> str:
    return Web3.to_checksum_address(address)


def is_address(value: str) -> bool:
    return Web3.is_address(value)


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
        contract = Web3().eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
        data = contract.constructor(*args).data_in_transaction
        receipt = self._transact(sender, {"data": data})
        return receipt["contractAddress"].lower()

    def _call_data(self, name: str, function: str, *args) -> str:
        contract = Web3().eth.contract(abi=self.artifact(name)["abi"])
        return contract.encode_abi(function, args=list(args))

    def mint(self, token: str, to: str, amount: int, *, sender: str, contract: str = "DemoStablecoin") -> str:
        receipt = self._transact(sender, {"to": token, "data": self._call_data(contract, "mint", checksum(to), amount)})
        return receipt["transactionHash"]

    def send_token(self, token: str, to: str, amount: int, *, sender: str, contract: str = "DemoStablecoin") -> dict:
        data = self._call_data(contract, "transfer", checksum(to), amount)
        return self._transact(sender, {"to": token, "data": data})

    def send_native(self, to: str, value: int, *, sender: str) -> dict:
        return self._transact(sender, {"to": to, "value": hex(value)})

    def set_rate(self, feed: str, answer: int, *, sender: str) -> None:
        self._transact(sender, {"to": feed, "data": self._call_data("MockAggregator", "setAnswer", answer)})

    def mine(self, blocks: int = 1) -> None:
        self.request("anvil_mine", [hex(blocks)])

    def snapshot(self) -> str:
        return self.request("evm_snapshot", [])

    def revert(self, snapshot_id: str) -> None:
        self.request("evm_revert", [snapshot_id])

    def balance_of(self, token: str, owner: str) -> int:
        data = self._call_data("DemoStablecoin", "balanceOf", checksum(owner))
        return int(self.request("eth_call", [{"to": token, "data": data}, "latest"]), 16)
