"""What a chain's nodes answer, read as hostile input, without web3 (`payments/chain.py`, which with
`chain_demo.py` is the only module that imports it, sends the requests and hands the answers here); ABI-encoded
return values are decoded by eth_abi (which web3 ships), within the bounds set here.

`parse_transfer_log` decides what counts as an ERC-20 transfer of an allow-listed token and `parse_block` what
native coin a block's transactions carried to the watched addresses; both skip, never raise on, what a node
invents inside an answer, and return the frozen records the scanner works with (`TransferLog`, grouped as a
`LogRange` or a `BlockRange`). `parse_feed_round` reads a rate feed's round. The field parsers (quantities, block
references) raise ValueError on a malformed field, so that the adapter counts that URL as failed and asks the
next. `classify_error` sorts a JSON-RPC error into rate limit, range refusal or anything else, by how providers
word them. Kept apart from the adapter so that the rules for what the chain says are read, and tested, without a
node.
"""

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from eth_abi import decode as abi_decode
from eth_abi.exceptions import DecodingError

# keccak("Transfer(address,address,uint256)"), the topic of every ERC-20 Transfer log (tests/payments check it).
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
# An amount no real token reaches (2^128 base units is 3.4e20 coins of 18 decimals): anything above is refused, so
# that no sum of credits can approach the 78 digits an amount column holds.
MAX_TRANSFER_UNITS = 2**128 - 1

_HASH = re.compile(r"0x[0-9a-f]{64}")
_QUANTITY = re.compile(r"0x[0-9a-f]{1,16}")
_ADDRESS_TOPIC = re.compile(r"0x0{24}[0-9a-f]{40}")
_WORD = re.compile(r"0x[0-9a-f]{64}")
_ADDRESS = re.compile(r"0x[0-9a-f]{40}")
_VALUE = re.compile(r"0x[0-9a-f]{1,64}")

# How providers word their refusals. A rate limit is recognised first: Infura answers both a rate limit and a
# too-wide eth_getLogs with code -32005.
_RATE_LIMIT_WORDS = ("rate limit", "rate-limit", "ratelimit", "too many requests", "request count exceeded", "throttl")
_RANGE_REFUSAL_WORDS = (
    "block range",
    "range is too",
    "range too",
    "more than",
    "too many blocks",
    "results",
    "response size",
    "response is too big",
    "query timeout",
)
RATE_LIMIT_CODES = frozenset({-32005, -32029, 429})
# Range-cap wordings of hosted providers: QuickNode ("eth_getLogs and eth_newFilter are limited to a 10,000 blocks
# range"), Ankr ("maximum [from, to] blocks distance: 10000"), Infura ("range 1000000 exceeds limit of 10000"),
# Tenderly ("range 9009594 is bigger than range limit 2000").
_RANGE_REFUSAL_WORDS += ("limited to a", "blocks range", "blocks distance", "exceeds limit", "range limit")
# A backend whose head is below the range's end (load-balanced URLs mix backends of different heads): geth and reth
# ("block range extends beyond current head block"), Avalanche ("requested to block … after last accepted block
# …"), others ("block … is beyond the latest block … of this node, retry later", "header not found"). The range is
# not too wide, it is not there yet: wait, never narrow it (narrowing would pass its blocks as read).
_BEHIND_HEAD_WORDS = (
    "beyond current head",
    "beyond the current head",
    "after last accepted block",
    "beyond the latest block",
    "is beyond the latest",
    "retry later",
    "greater than the current head",
    "greater than latest",
    "invalid block range params",
    "header not found",
    "block not found",
    "unknown block",
    "cannot be found",
    "could not be found",  # Nethermind: "<block> could not be found"
    "invalid block range",  # Hyperliquid, for a range beyond its head
)


def classify_error(error: dict, method: str) -> str:
    """`rate_limited`, `behind_head` or `range_refused` (only for eth_getLogs) or `error`, from a JSON-RPC error
    object."""
    message = str(error.get("message", "")).lower()
    code = error.get("code")
    if any(word in message for word in _RATE_LIMIT_WORDS):
        return "rate_limited"
    if method == "eth_getLogs" and any(word in message for word in _BEHIND_HEAD_WORDS):
        return "behind_head"
    if method == "eth_getLogs" and any(word in message for word in _RANGE_REFUSAL_WORDS):
        return "range_refused"
    if code in RATE_LIMIT_CODES:
        return "rate_limited"
    return "error"


def says_behind_head(error: object) -> bool:
    """Whether a JSON-RPC error says the node does not hold the block asked for (a read at an explicit block by a
    backend behind it): no answer yet, never "nothing there"."""
    return isinstance(error, dict) and any(word in str(error.get("message", "")).lower() for word in _BEHIND_HEAD_WORDS)


def is_unknown_method(error: object) -> bool:
    """Whether a JSON-RPC error says the node does not offer the method (-32601, or providers' wordings)."""
    if not isinstance(error, dict):
        return False
    message = str(error.get("message", "")).lower()
    return error.get("code") == -32601 or any(
        words in message for words in ("method not found", "not supported", "unsupported method", "does not exist")
    )


@dataclass(frozen=True)
class TransferLog:
    """A credit read on chain: an ERC-20 Transfer log, or the native coin carried by a transaction (`token` "" and
    `log_index` -1: a transaction carries one value)."""

    tx_hash: str
    log_index: int
    block_number: int
    block_hash: str
    token: str  # lower-case contract address
    sender: str  # lower-case
    recipient: str  # lower-case
    amount: int


@dataclass(frozen=True)
class LogRange:
    """The well-formed transfers of allow-listed tokens in [start, end], and how many logs were skipped."""

    start: int
    end: int
    logs: list[TransferLog]
    skipped: int


@dataclass(frozen=True)
class BlockRange:
    """The canonical (hash, timestamp) of every block of [start, end], the native coin its transactions carried to
    the watched addresses, and how many such transactions were skipped as malformed."""

    blocks: dict[int, tuple[str, int]]
    transfers: list[TransferLog]
    skipped: int
    # Each block's (hash, timestamp, parent hash), for the next cycle to check them by header alone.
    links: dict[int, tuple[str, int, str]] = field(default_factory=dict)
    # Blocks whose hash matched the one known from a previous read: not read again in full (their transactions
    # are what they were), so `transfers` holds nothing from them.
    unchanged: frozenset[int] = frozenset()


@dataclass(frozen=True)
class FeedRound:
    """What a rate feed answered; `rate` is None when the answer could not be read as a round."""

    has_code: bool
    rate: Decimal | None = None
    round_id: int = 0
    updated_at: int = 0  # unix seconds
    answered_in_round: int = 0
    description: str = ""


def _address_from_topic(topic: str) -> str:
    return "0x" + topic[-40:].lower()


def parse_quantity(value: object) -> int:
    """A block number or an index: at most 16 hexadecimal digits, lower or upper case."""
    if not isinstance(value, str) or not _QUANTITY.fullmatch(value.lower()):
        raise ValueError(f"not a quantity: {value!r}"[:100])
    return int(value, 16)


def parse_transfer_log(entry: object, *, tokens: frozenset[str]) -> TransferLog | None:
    """A log as a transfer of an allow-listed token, or None when it is anything else: another contract, another
    event, missing or extra topics, data that is not exactly one 32-byte word, an amount of zero or beyond
    MAX_TRANSFER_UNITS, a log the node flags as removed, fields that are not what they claim. The chain is hostile
    input: nothing here raises."""
    if not isinstance(entry, dict) or entry.get("removed") not in (None, False):
        return None
    topics, data = entry.get("topics"), entry.get("data")
    address = entry.get("address")
    if not isinstance(address, str) or address.lower() not in tokens:
        return None
    if not isinstance(topics, list) or len(topics) != 3 or not all(isinstance(topic, str) for topic in topics):
        return None
    topics = [topic.lower() for topic in topics]
    if topics[0] != TRANSFER_TOPIC or not all(_ADDRESS_TOPIC.fullmatch(topic) for topic in topics[1:]):
        return None
    if not isinstance(data, str) or not _WORD.fullmatch(data.lower()):
        return None
    amount = int(data, 16)
    if not 0 < amount <= MAX_TRANSFER_UNITS:
        return None
    tx_hash, block_hash = entry.get("transactionHash"), entry.get("blockHash")
    if not (isinstance(tx_hash, str) and _HASH.fullmatch(tx_hash.lower())):
        return None
    if not (isinstance(block_hash, str) and _HASH.fullmatch(block_hash.lower())):
        return None
    try:
        block_number, log_index = parse_quantity(entry.get("blockNumber")), parse_quantity(entry.get("logIndex"))
    except ValueError:
        return None
    if block_number >= 2**63 or log_index >= 2**63:
        return None
    return TransferLog(
        tx_hash=tx_hash.lower(),
        log_index=log_index,
        block_number=block_number,
        block_hash=block_hash.lower(),
        token=address.lower(),
        sender=_address_from_topic(topics[1]),
        recipient=_address_from_topic(topics[2]),
        amount=amount,
    )


def parse_block(block: object, *, number: int, recipients: frozenset[str]) -> BlockRange:
    """A block asked with its transactions: its hash and time, and the native coin its transactions sent to
    `recipients`. A block that is not one (missing, another number, transactions as bare hashes) raises ValueError:
    the URL that answered it failed, the next is asked. A transaction to a recipient that is malformed (a value out
    of range, a bad hash) is skipped and counted; transactions to anyone else are not looked at.

    A transaction in a block may have failed: the recipient may hold code that reverts (an address is only empty
    until someone deploys to it or, on a test node, sets its code), and on OP-stack chains a deposit transaction
    (type 0x7e) whose value exceeds what its sender holds is included all the same and fails. What is returned here
    is only what the transactions claim: the adapter reads their receipts and keeps those whose status is success
    (`successful_transactions`) before anything is credited."""
    if not isinstance(block, dict):
        raise ValueError(f"block {number} missing")
    block_hash, timestamp = parse_block_ref(block)
    if parse_quantity(block.get("number")) != number:
        raise ValueError(f"asked for block {number}, answered another")
    transactions = block.get("transactions")
    if not isinstance(transactions, list) or not all(isinstance(tx, dict) for tx in transactions):
        raise ValueError(f"block {number} without its transactions")
    transfers, skipped = [], 0
    for tx in transactions:
        recipient = tx.get("to")
        if not isinstance(recipient, str) or recipient.lower() not in recipients:
            continue
        value, tx_hash, sender = tx.get("value"), tx.get("hash"), tx.get("from")
        if not (isinstance(value, str) and _VALUE.fullmatch(value.lower())):
            skipped += 1
            continue
        amount = int(value, 16)
        if amount == 0:
            continue  # a call that pays nothing
        valid = (
            amount <= MAX_TRANSFER_UNITS
            and isinstance(tx_hash, str)
            and _HASH.fullmatch(tx_hash.lower())
            and isinstance(sender, str)
            and _ADDRESS.fullmatch(sender.lower())
        )
        if not valid:
            skipped += 1
            continue
        transfers.append(
            TransferLog(
                tx_hash=tx_hash.lower(),
                log_index=-1,
                block_number=number,
                block_hash=block_hash,
                token="",
                sender=sender.lower(),
                recipient=recipient.lower(),
                amount=amount,
            )
        )
    return BlockRange(
        blocks={number: (block_hash, timestamp)},
        transfers=transfers,
        skipped=skipped,
        links={number: (block_hash, timestamp, _parent_hash(block))},
    )


# The EIP-2718 type of an OP-stack deposit transaction: included by the rollup whatever it carries. Its `mint` is
# credited to the sender whatever happens; its `value` moves to `to` only when its receipt says success.
OP_DEPOSIT_TX_TYPE = 0x7E


def successful_transactions(receipts: object, *, wanted: frozenset[str]) -> frozenset[str]:
    """The hashes among `wanted` whose receipt says success (status 0x1), from a list of receipts (a block's, or
    one per transaction). A receipt without a status (pre-Byzantium), with another value, or malformed does not
    count as success: nothing is credited from a transaction whose success is not shown. OP-stack deposits
    (type 0x7e) follow the same rule, their value being minted to the recipient only on success. A missing
    receipt for a wanted transaction is the node's failure (ValueError), so that the next URL is asked."""
    if not isinstance(receipts, list):
        raise ValueError("receipts: not a list")
    found, succeeded = set(), set()
    for receipt in receipts:
        if not isinstance(receipt, dict):
            continue
        tx_hash = receipt.get("transactionHash")
        if not isinstance(tx_hash, str) or tx_hash.lower() not in wanted:
            continue
        found.add(tx_hash.lower())
        if receipt.get("status") in ("0x1", "0x01"):
            succeeded.add(tx_hash.lower())
    return frozenset(succeeded) if found >= wanted else _missing_receipts(wanted - found)


def _missing_receipts(missing: frozenset[str]):
    raise ValueError(f"no receipt for {len(missing)} transaction(s), e.g. {sorted(missing)[0]}")


# A feed's description ("ETH / USD") is short: a longer one is not read. Its answer is the offset word, the length
# word and the text padded to whole words; anything longer is refused before it is decoded.
MAX_DESCRIPTION_BYTES = 200
_MAX_ABI_STRING_ANSWER = 32 + 32 + -(-MAX_DESCRIPTION_BYTES // 32) * 32
# latestRoundData() returns (uint80 roundId, int256 answer, uint256 startedAt, uint256 updatedAt,
# uint80 answeredInRound).
_ROUND_TYPES = ["uint80", "int256", "uint256", "uint256", "uint80"]


def _abi_bytes(raw: object, *, limit: int) -> bytes:
    """The bytes of a hex answer of at most `limit` bytes; ValueError for anything else."""
    if not isinstance(raw, str) or len(raw) > 2 + 2 * limit:
        raise ValueError("not a short hex answer")
    return bytes.fromhex(raw.removeprefix("0x"))


def parse_abi_string(raw: object) -> str:
    """An ABI-encoded string return value, or "" when it is not one (bounded: a description is short). Bytes that
    are not UTF-8 are replaced, not refused: the text is only shown."""
    try:
        (text,) = abi_decode(["bytes"], _abi_bytes(raw, limit=_MAX_ABI_STRING_ANSWER))
    except (ValueError, OverflowError, DecodingError):
        return ""
    return "" if len(text) > MAX_DESCRIPTION_BYTES else text.decode("utf-8", errors="replace")


def parse_feed_round(*, code: object, decimals: object, latest_round: object, description: object) -> FeedRound:
    """A Chainlink-style aggregator's answers to `eth_getCode`, `decimals()`, `latestRoundData()` and
    `description()`: no code at the address, a round that cannot be read (`rate` None), or the round. Whether
    that round may price anything is for the caller to judge. The words are decoded as their ABI types, strictly
    (padding included); an answer longer than its words is not read."""
    if not isinstance(code, str) or code in ("0x", "0x0", ""):
        return FeedRound(has_code=False)
    try:
        (places,) = abi_decode(["uint8"], _abi_bytes(decimals, limit=32))
        round_id, answer, _started_at, updated_at, answered_in_round = abi_decode(
            _ROUND_TYPES, _abi_bytes(latest_round, limit=32 * len(_ROUND_TYPES))
        )
    except (ValueError, OverflowError, DecodingError):
        return FeedRound(has_code=True)
    if not 0 <= places <= 36:
        return FeedRound(has_code=True)
    return FeedRound(
        has_code=True,
        rate=Decimal(answer).scaleb(-places),
        round_id=round_id,
        updated_at=updated_at,
        answered_in_round=answered_in_round,
        description=parse_abi_string(description),
    )


def parse_log_list(result) -> list:
    if not isinstance(result, list):
        raise ValueError("eth_getLogs did not answer a list")
    return result


def parse_uint256(result) -> int:
    """A balance or a nonce: at most 64 hexadecimal digits."""
    if not isinstance(result, str) or not re.fullmatch(r"0x[0-9a-fA-F]{1,64}", result):
        raise ValueError(f"not a quantity: {result!r}"[:100])
    return int(result, 16)


def parse_block_ref(block) -> tuple[str, int]:
    """A block's (hash, timestamp); ("", 0) for a block the node does not have."""
    if block is None:
        return "", 0
    value = block.get("hash") if isinstance(block, dict) else None
    if not isinstance(value, str) or not _HASH.fullmatch(value.lower()):
        raise ValueError("block without a valid hash")
    return value.lower(), parse_quantity(block.get("timestamp"))


def parse_header(block) -> tuple[str, int, str]:
    """A block header's (hash, timestamp, parent hash); ("", 0, "") for a block the node does not have."""
    block_hash, timestamp = parse_block_ref(block)
    if not block_hash:
        return "", 0, ""
    return block_hash, timestamp, _parent_hash(block)


def _parent_hash(block: dict) -> str:
    """A block's parent hash, "" when it has none readable (then nothing is inferred from it)."""
    parent = block.get("parentHash")
    return parent.lower() if isinstance(parent, str) and _HASH.fullmatch(parent.lower()) else ""


def parse_timestamp(timestamp: int) -> datetime | None:
    """A block's or a feed's unix time as a datetime, or None when it is none."""
    try:
        return datetime.fromtimestamp(timestamp, tz=UTC)
    except (OverflowError, OSError, ValueError):  # a node's nonsense is no time at all
        return None
