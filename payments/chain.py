"""The chain adapter: with `payments/chain_demo.py`, the only module that imports web3.

`ChainClient` reads what the scanner needs, in a fixed number of round trips whatever the number of invoices:
the head, the confirmed block, ERC-20 Transfer logs of the allow-listed contracts, the blocks of a range with their
transactions (native coin paid to deposit addresses is matched in Python), a bounded batch of native balances. It
rotates to the next RPC URL when one fails, backs off when rate-limited, shrinks an eth_getLogs range that a
provider refuses (a single block that still overflows is read per contract, then by recipient), and raises
`ChainUnavailable` when nothing answers. Every round trip is counted (`calls`), for bench/chain_scan.py. What
the nodes answer is parsed and judged by `payments/chain_answers.py` (what counts as a transfer, how a refusal is
classified), which needs no web3; this module sends the requests and keeps what needs web3 (keccak selectors,
checksummed addresses, ABI encoding). The development chain's helpers (anvil) are `payments/chain_demo.py`.
"""

import hashlib
import logging
import time
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.core.cache import cache
from web3 import Web3
from web3.providers.rpc import HTTPProvider

from payments.chain_answers import (
    TRANSFER_TOPIC,
    BlockRange,
    FeedRound,
    LogRange,
    TransferLog,
    classify_error,
    is_unknown_method,
    parse_block,
    parse_block_ref,
    parse_feed_round,
    parse_header,
    parse_log_list,
    parse_quantity,
    parse_transfer_log,
    parse_uint256,
    says_behind_head,
    successful_transactions,
)
from payments.config import Chain

logger = logging.getLogger(__name__)


def _keccak_hex(text: str) -> str:
    return "0x" + Web3.keccak(text=text).hex().removeprefix("0x")


DECIMALS_CALL = _keccak_hex("decimals()")[:10]

# What common providers accept (geth's defaults; hosted providers are often stricter on ranges, set per chain).
MAX_BATCH = 1000  # calls in one JSON-RPC batch
MAX_TOPICS = 1000  # topics in one eth_getLogs filter
# Blocks asked with their transactions in one batch: a mainnet block is 100-300 kB that way, so a catch-up over
# thousands of blocks goes in answers of a few tens of megabytes at most.
FULL_BLOCKS_PER_BATCH = 100


# A URL that rate-limited is asked last by the following scans for this long.
RATE_LIMIT_COOLDOWN_SECONDS = 60


def _cooldown_key(url: str) -> str:
    return "rpc-cooldown:" + hashlib.sha256(url.encode()).hexdigest()[:32]


class ChainUnavailable(Exception):
    """No RPC URL of the chain answered usefully. Nothing was changed; try again later."""


class RangeRefused(Exception):
    """A provider refused an eth_getLogs range as too wide (or its answer as too big): ask for a narrower one."""


class RangeNotReady(Exception):
    """Every URL answering for an eth_getLogs range is behind its end (it said so, or could not show the range's last
    block): the range is read again by a later scan, never passed as read."""


class RpcError(Exception):
    def __init__(self, error: object) -> None:
        self.error = error if isinstance(error, dict) else {"message": repr(error)[:200]}
        super().__init__(f"{self.error.get('code')}: {str(self.error.get('message'))[:200]}")


class Lagging(Exception):
    """The node's head is behind a block this scan already relies on: it is late, not reorganised."""


class WrongChain(Exception):
    """A URL serves another chain than the one it is configured for: it is not asked again by this client."""


def url_host(url: str) -> str:
    """The host (and port) of an RPC URL, for logs and alerts: never its path, query or credentials, where
    providers put their keys."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    return f"{host}:{parts.port}" if parts.port else host


def redact_url(text: str, url: str) -> str:
    """`text` (an exception's message, which HTTP libraries write with the URL's path in it) without the URL's
    path, query or credentials: what is left names the host only."""
    parts = urlsplit(url)
    secrets_ = [url, url.rstrip("/"), parts.path + (f"?{parts.query}" if parts.query else ""), parts.query]
    secrets_ += [parts.password or "", parts.username or ""]
    for secret in sorted({secret for secret in secrets_ if len(secret) > 1}, key=len, reverse=True):
        text = text.replace(secret, "…")
    return text


def _address_topic(address: str) -> str:
    return "0x" + "0" * 24 + address.lower().removeprefix("0x")


def _rate_limited(exc: Exception) -> bool:
    """Whether a failed call was a rate limit (HTTP 429, or a JSON-RPC error worded or numbered as one)."""
    if isinstance(exc, requests.HTTPError):
        return exc.response is not None and exc.response.status_code == 429
    return isinstance(exc, RpcError) and classify_error(exc.error, "") == "rate_limited"


class ChainClient:
    def __init__(self, chain: Chain, *, timeout: float = 5.0, backoff: float = 0.25) -> None:
        self.chain = chain
        self.calls = 0
        self.backoff = backoff
        self.errors: list[str] = []  # every URL's failure, in order, for the record and the tests
        self._providers = [
            HTTPProvider(url, request_kwargs={"timeout": timeout}, exception_retry_configuration=None)
            for url in chain.rpc_urls
        ]
        # A URL that rate-limited a recent scan (any worker: the shared cache) is asked last until it cools down.
        cooling = cache.get_many([_cooldown_key(url) for url in chain.rpc_urls])
        self._preferred = next(
            (index for index, url in enumerate(chain.rpc_urls) if _cooldown_key(url) not in cooling), 0
        )
        self._cooling = {index for index, url in enumerate(chain.rpc_urls) if _cooldown_key(url) in cooling}
        # Once the head is read, every other URL must show at least that head before it answers for this cycle: a
        # lagging node would return fewer logs and no blocks beyond its own head.
        self._required_head: int | None = None
        self._verified: set[int] = set()
        # URLs whose eth_chainId answered this chain (checked at first use, and again after any failure), and URLs
        # set aside for the life of this client: another chain, or a head no other URL comes near.
        self._chain_checked: set[int] = set()
        self._dropped: set[int] = set()
        # URLs that do not know eth_getBlockReceipts: receipts are read per transaction there.
        self._without_block_receipts: set[str] = set()
        # The first block of the log range that no URL could serve yet (None: every range asked was read).
        self.not_ready_from: int | None = None
        # (block, token, address) whose transfers in a crowded block could not be read at all, for the record.
        self.unread: list[tuple[int, str, str]] = []
        # The hash of the last block of each log range read, from the header asked with its logs: `block_range`
        # needs no other request to check that block.
        self._end_hashes: dict[int, str] = {}

    # --- transport: failover, backoff, one counted round trip per call ----------------------------------------
    def _send(self, send, method: str) -> object:
        """Ask each URL in turn, starting with the one that answered last. Each failure is classified for its
        URL: a rate limit backs off before the next URL; a refused eth_getLogs range raises RangeRefused (the
        caller narrows it); anything else, known or not, moves on to the next URL. None answering is
        ChainUnavailable, with what each said (RangeNotReady when a log range was beyond a URL's head).

        Each URL shows its chain id before its first answer is used, and again after an error other than a rate
        limit or a range answer: behind a load balancer, a failing URL may have been moved to another chain."""
        errors = []
        behind = False  # a URL answered that the range is beyond its head
        count = len(self._providers)
        for attempt in range(count):
            index = (self._preferred + attempt) % count
            provider = self._providers[index]
            if index in self._dropped:
                errors.append(f"{url_host(provider.endpoint_uri)}: set aside for this scan")
                continue
            try:
                if index not in self._chain_checked:
                    self._check_chain_id(index)
                    self._chain_checked.add(index)
                if self._required_head is not None and index not in self._verified:
                    self._check_not_lagging(provider)
                    self._verified.add(index)
                self.calls += 1
                result = send(provider)
            except WrongChain as exc:
                errors.append(f"{url_host(provider.endpoint_uri)}: {exc}")
                continue
            except requests.HTTPError as exc:
                status = exc.response.status_code if exc.response is not None else None
                if status == 429:
                    errors.append(f"{url_host(provider.endpoint_uri)}: rate limited (HTTP 429)")
                    self._cool_down(provider, attempt)
                else:
                    errors.append(f"{url_host(provider.endpoint_uri)}: HTTP {status}")
                    self._chain_checked.discard(index)
                continue
            except RpcError as exc:
                kind = classify_error(exc.error, method)
                if kind == "range_refused":
                    raise RangeRefused(str(exc)) from exc
                behind = behind or kind == "behind_head"
                errors.append(
                    f"{url_host(provider.endpoint_uri)}: {kind.replace('_', ' ')} "
                    f"({redact_url(str(exc), provider.endpoint_uri)})"
                )
                if kind == "rate_limited":
                    self._cool_down(provider, attempt)
                elif kind == "error":
                    self._chain_checked.discard(index)
                continue
            except Lagging as exc:
                errors.append(
                    f"{url_host(provider.endpoint_uri)}: lagging ({redact_url(str(exc), provider.endpoint_uri)})"
                )
                behind = True
                continue
            except Exception as exc:  # an unknown answer is this URL's failure, never the scan's
                errors.append(
                    f"{url_host(provider.endpoint_uri)}: {type(exc).__name__}: "
                    f"{redact_url(str(exc), provider.endpoint_uri)[:200]}"
                )
                self._chain_checked.discard(index)
                continue
            self._preferred = index
            self.errors.extend(errors)
            return result
        self.errors.extend(errors)
        if behind and method == "eth_getLogs":
            raise RangeNotReady(f"chain {self.chain.chain_id}: " + "; ".join(errors))
        raise ChainUnavailable(f"chain {self.chain.chain_id}: " + "; ".join(errors))

    def _cool_down(self, provider, attempt: int) -> None:
        cache.set(_cooldown_key(provider.endpoint_uri), True, timeout=RATE_LIMIT_COOLDOWN_SECONDS)
        time.sleep(self.backoff * (attempt + 1))

    def _check_chain_id(self, index: int) -> None:
        """Ask the URL which chain it serves; another chain's URL is dropped for the life of this client, with an
        error naming the chain and the URL's host (never its key)."""
        provider = self._providers[index]
        self.calls += 1
        response = provider.make_request("eth_chainId", [])
        if not isinstance(response, dict) or response.get("error") or "result" not in response:
            raise RpcError(response.get("error") if isinstance(response, dict) else response)
        served = parse_quantity(response["result"])
        if served != self.chain.chain_id:
            self._dropped.add(index)
            logger.error(
                "chain %s: the RPC URL at %s serves chain %s: not used by this scan; fix the chains file",
                self.chain.chain_id,
                url_host(provider.endpoint_uri),
                served,
            )
            raise WrongChain(f"serves chain {served}, not {self.chain.chain_id}")

    def _check_not_lagging(self, provider) -> None:
        self.calls += 1
        response = provider.make_request("eth_blockNumber", [])
        if not isinstance(response, dict) or response.get("error") or "result" not in response:
            raise Lagging(f"its head could not be read ({str(response)[:200]})")
        head = parse_quantity(response["result"])
        if head < self._required_head:
            raise Lagging(f"head {head} behind block {self._required_head}")

    def request(self, method: str, params: list, parse=None) -> object:
        """One call; `parse` turns the result into what the caller needs and runs per URL, so a malformed
        answer is that URL's failure and the next URL is asked."""

        def send(provider):
            response = provider.make_request(method, params)
            if not isinstance(response, dict):
                raise RpcError(response)
            if response.get("error"):
                raise RpcError(response["error"])
            if "result" not in response:
                raise RpcError({"message": "no result"})
            return parse(response["result"]) if parse else response["result"]

        return self._send(send, method)

    def batch(self, requests_: list[tuple[str, list]], parse=None) -> list:
        """Calls in batches of at most MAX_BATCH (the chain's `max_batch` when lower), in order. `parse` is one
        function for every result or a list, one per call."""
        size = max(1, min(MAX_BATCH, self.chain.max_batch))
        results: list = []
        for offset in range(0, len(requests_), size):
            part = parse[offset : offset + size] if isinstance(parse, list) else parse
            results.extend(self._batch(requests_[offset : offset + size], part))
        return results

    def _batch(self, requests_: list[tuple[str, list]], parse) -> list:
        method = requests_[0][0] if requests_ else ""

        def send(provider):
            responses = provider.make_batch_request(requests_)
            if not isinstance(responses, list):
                raise RpcError(responses.get("error") if isinstance(responses, dict) else responses)
            if len(responses) != len(requests_):
                raise RpcError({"message": f"batch of {len(requests_)} answered with {len(responses)}"})
            for response in responses:
                if not isinstance(response, dict):
                    raise RpcError(response)
                if response.get("error"):
                    raise RpcError(response["error"])
            results = [response.get("result") for response in responses]
            if isinstance(parse, list):
                return [each(result) for each, result in zip(parse, results, strict=True)]
            return [parse(result) for result in results] if parse else results

        return self._send(send, method)

    # --- reads ---------------------------------------------------------------------------------------------
    def head(self, *, not_below: int = 0) -> int:
        """The newest block of the first URL whose head is not behind `not_below` (the scan's cursor): a node
        behind the cursor is lagging, not reorganised, and the next URL is asked. Every later call of this
        client goes to a URL whose head is at least this one."""

        def parse(result) -> int:
            head = parse_quantity(result)
            if head < not_below:
                raise Lagging(f"head {head} behind the cursor at {not_below}")
            return head

        if len(self._providers) > 1:
            self._set_aside_far_heads(not_below=not_below)
        head = self.request("eth_blockNumber", [], parse)
        self._required_head = head
        self._verified = {self._preferred}
        return head

    def _set_aside_far_heads(self, *, not_below: int) -> None:
        """Every usable URL's head, once (those cooling down after a rate limit are left alone): a head more than
        PAYMENTS_MAX_HEAD_LEAD_BLOCKS ahead of every other answering URL is not believed (that URL is set aside
        for this client), so that one URL on a far-future fork, or answering nonsense, cannot move the cursor past
        the real chain. A head behind `not_below` (the cursor) is stale already and is no measure of the others:
        a URL stuck for hours does not make the honest ones look too far ahead. URLs that fail here are left to
        the usual failover."""
        heads: dict[int, int] = {}
        for index, provider in enumerate(self._providers):
            if index in self._dropped or index in self._cooling:
                continue
            try:
                if index not in self._chain_checked:
                    self._check_chain_id(index)
                    self._chain_checked.add(index)
                self.calls += 1
                response = provider.make_request("eth_blockNumber", [])
                heads[index] = parse_quantity(response["result"])
            except Exception as exc:  # that URL's failure is recorded by the failover when it is next asked
                logger.info(
                    "chain %s: no head from %s (%s)",
                    self.chain.chain_id,
                    url_host(provider.endpoint_uri),
                    type(exc).__name__,
                )
        lead = settings.PAYMENTS_MAX_HEAD_LEAD_BLOCKS
        for index, head in heads.items():
            others = [other for position, other in heads.items() if position != index and other >= not_below]
            if others and head > max(others) + lead:
                self._dropped.add(index)
                logger.error(
                    "chain %s: the RPC URL at %s claims head %s, more than %s blocks ahead of the others (%s): "
                    "not believed by this scan",
                    self.chain.chain_id,
                    url_host(self._providers[index].endpoint_uri),
                    head,
                    lead,
                    max(others),
                )

    def confirmed_block(self, head: int) -> int:
        """The newest block considered final: the node's `finalized` tag, or head − confirmations + 1."""
        if self.chain.finality == "finalized":
            number = self.request(
                "eth_getBlockByNumber", ["finalized", False], lambda block: parse_quantity(block["number"])
            )
            return min(number, head)
        return max(0, head - self.chain.confirmations + 1)

    def log_ranges(
        self,
        *,
        from_block: int,
        to_block: int,
        tokens: frozenset[str],
        recipients: frozenset[str],
        ready_to: int | None = None,
    ):
        """Transfer logs of the allow-listed `tokens` in [from_block, to_block], one range at a time, as `LogRange`s:
        the request filters by contract address and the Transfer topic only, so its size does not depend on how many
        deposit addresses are watched; the caller matches recipients. A range not served yet (its backend a few
        blocks behind the head) is asked again up to `ready_to` (the confirmed block) when it reaches beyond it: the
        confirmed part is read and committed, only the tail waits for the next scan. A range refused by the provider
        is halved and asked again, and widens again (doubling) once a range is answered. A single block that is still
        refused is read per contract, then by recipient (`_crowded_block`). Without tokens the ranges are still
        yielded, empty, for the caller to read their blocks."""
        if from_block > to_block:
            return
        widest = max(1, self.chain.max_block_range)
        start, span = from_block, widest
        while start <= to_block:
            end = min(to_block, start + span - 1)
            try:
                try:
                    raw = self._logs(start, end, sorted(tokens)) if tokens else []
                except RangeRefused:
                    if span > 1:
                        span = max(1, span // 2)
                        continue
                    raw = self._crowded_block(start, tokens=tokens, recipients=recipients)
            except RangeNotReady:
                if ready_to is not None and start <= ready_to < end:
                    # A backend a few blocks behind the head still holds the confirmed part: read that (its end
                    # header proves it), leave the tail to the next scan.
                    self.not_ready_from = ready_to + 1
                    to_block, span = ready_to, ready_to - start + 1
                    continue
                # The node answering is behind this range: what was read so far stands, the rest waits for the
                # next scan (narrowing the range would pass its blocks as read).
                self.not_ready_from = start
                logger.info("chain %s: blocks %s-%s not served yet, read later", self.chain.chain_id, start, end)
                return
            logs = [log for entry in raw if (log := parse_transfer_log(entry, tokens=tokens)) is not None]
            yield LogRange(start=start, end=end, logs=logs, skipped=len(raw) - len(logs))
            start, span = end + 1, min(widest, span * 2)

    def _logs(self, start: int, end: int, addresses: list[str], topics: list | None = None) -> list:
        """The logs of [start, end], trusted only with proof that the backend that answered holds the range: the
        range's last block header is asked in the same batch (a backend whose head is below `end` answers null for
        it, or an error, whether it clamped its log answer silently or not). Without that proof the URL is
        behind: `RangeNotReady` once no URL can show it."""
        query = {
            "fromBlock": hex(start),
            "toBlock": hex(end),
            "address": addresses,
            "topics": topics or [TRANSFER_TOPIC],
        }

        def covered(header) -> str:
            if header is None:
                raise Lagging(f"block {end}, the end of the range, not served with its logs")
            if parse_quantity(header.get("number") if isinstance(header, dict) else None) != end:
                raise ValueError(f"asked for block {end}, answered another")
            return parse_block_ref(header)[0]

        logs, end_hash = self._batch(
            [("eth_getLogs", [query]), ("eth_getBlockByNumber", [hex(end), False])], [parse_log_list, covered]
        )
        self._end_hashes[end] = end_hash
        return logs

    def _crowded_block(self, number: int, *, tokens: frozenset[str], recipients: frozenset[str]) -> list:
        """The logs of one block that holds more than a provider returns at once (anyone can fill a block with
        Transfer logs of a listed contract for a few dollars): each contract alone; a contract that still overflows,
        by its transfers to the watched addresses, at most MAX_TOPICS − 2 recipient topics a request, halving a
        group that still overflows. Only a single watched address that received more than the cap in this block is
        left unread (logged as an error): the block is passed, and every other payment in it is credited."""
        raw: list = []
        for token in sorted(tokens):
            try:
                raw += self._logs(number, number, [token])
                continue
            except RangeRefused:
                pass
            watched = sorted(recipients)
            size = MAX_TOPICS - 2  # the filter's entries, the Transfer topic and the wildcard sender included
            groups = [watched[offset : offset + size] for offset in range(0, len(watched), size)]
            while groups:
                group = groups.pop()
                try:
                    raw += self._logs(
                        number, number, [token], [TRANSFER_TOPIC, None, [_address_topic(a) for a in group]]
                    )
                except RangeRefused:
                    if len(group) > 1:
                        groups += [group[: len(group) // 2], group[len(group) // 2 :]]
                        continue
                    self.unread.append((number, token, group[0]))
                    logger.error(
                        "chain %s: block %s holds more transfers of %s to %s than the provider returns: not read",
                        self.chain.chain_id,
                        number,
                        token,
                        group[0],
                    )
        return raw

    def block_range(
        self,
        *,
        start: int,
        end: int,
        recipients: frozenset[str],
        known: dict[int, tuple[str, int, str]] | None = None,
    ) -> BlockRange:
        """The blocks of [start, end]: their canonical hashes and times, and the native coin their transactions sent
        to `recipients` (matched here; the requests do not depend on how many addresses are watched).

        `known` holds the (hash, timestamp, parent hash) of blocks read by an earlier cycle: those are checked by
        header alone and read again with their transactions only when their hash changed. When the known blocks
        form one chain (each the parent of the next), the hash of the highest one is enough: a block's hash covers
        its parent's, so the same hash there means every block under it is the same (it is the parent hash the next
        block names, when newer blocks are read anyway; else its header, read with the logs of the range it ends or
        alone). Otherwise, or when
        that hash changed, the headers of all of them are read (one batch) and only the changed ones are read in
        full. Blocks are read with their transactions in batches of FULL_BLOCKS_PER_BATCH."""
        known = {number: link for number, link in (known or {}).items() if start <= number <= end}
        blocks: dict[int, tuple[str, int]] = {}
        links: dict[int, tuple[str, int, str]] = {}
        transfers: list[TransferLog] = []
        skipped = 0

        def read_full(numbers: list[int]) -> None:
            nonlocal skipped
            size = max(1, min(FULL_BLOCKS_PER_BATCH, self.chain.max_batch))
            for offset in range(0, len(numbers), size):
                part = numbers[offset : offset + size]
                parsers = [
                    lambda block, number=number: parse_block(block, number=number, recipients=recipients)
                    for number in part
                ]
                claimed = []
                for read in self.batch([("eth_getBlockByNumber", [hex(number), True]) for number in part], parsers):
                    blocks.update(read.blocks)
                    links.update(read.links)
                    claimed += read.transfers
                    skipped += read.skipped
                succeeded = self.successful(claimed)
                transfers.extend(transfer for transfer in claimed if transfer.tx_hash in succeeded)

        unchanged: set[int] = set()
        if known:
            top = max(known)
            chained = all(
                number == top or known.get(number + 1, ("", 0, ""))[2] == known[number][0] for number in known
            )
            if chained and top < end:
                # The block after the highest known one names its parent: read anyway, it is the proof.
                read_full(list(range(top + 1, end + 1)))
                stands = links.get(top + 1, ("", 0, ""))[2] == known[top][0]
            elif chained:
                current = self._end_hashes.get(top) or self.blocks_headers([top])[0][0]
                stands = current == known[top][0]
            else:
                stands = False
            if stands:
                unchanged = set(known)
            else:
                checked = sorted(known)
                unchanged = {
                    number
                    for number, header in zip(checked, self.blocks_headers(checked), strict=True)
                    if header[0] and header[0] == known[number][0]
                }
            for number in unchanged:
                blocks[number], links[number] = known[number][:2], known[number]
        read_full([number for number in range(start, end + 1) if number not in unchanged and number not in blocks])
        return BlockRange(
            blocks=blocks, transfers=transfers, skipped=skipped, links=links, unchanged=frozenset(unchanged)
        )

    def blocks_headers(self, numbers: list[int]) -> list[tuple[str, int, str]]:
        """Each block's (hash, timestamp, parent hash), headers only (("", 0, "") for a block the node does not
        have), in batched round trips."""
        if not numbers:
            return []
        return self.batch([("eth_getBlockByNumber", [hex(number), False]) for number in numbers], parse_header)

    def successful(self, transfers: list[TransferLog]) -> frozenset[str]:
        """The hashes of `transfers` whose receipt says success: a transaction to a deposit address can revert
        (code at the address), and an OP-stack deposit transaction is included even when it fails. Read in one
        round trip: `eth_getBlockReceipts` for the blocks that hold them where the node has it, otherwise
        `eth_getTransactionReceipt` for these transactions only (a URL without the former is remembered)."""
        if not transfers:
            return frozenset()
        wanted = frozenset(transfer.tx_hash for transfer in transfers)
        numbers = sorted({transfer.block_number for transfer in transfers})
        size = max(1, min(MAX_BATCH, self.chain.max_batch))

        def answers(provider, calls: list) -> list | None:
            """The results of `calls`, batched; None when the node does not know the method."""
            results = []
            for offset in range(0, len(calls), size):
                if offset:
                    self.calls += 1
                responses = provider.make_batch_request(calls[offset : offset + size])
                if not isinstance(responses, list) or len(responses) != len(calls[offset : offset + size]):
                    raise RpcError(responses.get("error") if isinstance(responses, dict) else responses)
                for response in responses:
                    if not isinstance(response, dict):
                        raise RpcError(response)
                    if response.get("error"):
                        if is_unknown_method(response["error"]):
                            return None
                        raise RpcError(response["error"])
                    results.append(response.get("result"))
            return results

        def send(provider):
            if provider.endpoint_uri not in self._without_block_receipts:
                try:
                    lists = answers(provider, [("eth_getBlockReceipts", [hex(number)]) for number in numbers])
                except (RpcError, requests.RequestException) as exc:
                    # A block's receipts can be megabytes (anyone can fill a block with logs for a few dollars on
                    # an L2): a provider's answer-size cap or the client's timeout refuses them on every URL, and
                    # the scan would stall at that block for good. The matched transactions' own receipts are
                    # small: read those instead, this time. A rate limit is the URL's, as for any call.
                    if _rate_limited(exc):
                        raise
                    logger.info(
                        "chain %s: block receipts not served (%s): reading %s receipts one by one",
                        self.chain.chain_id,
                        redact_url(str(exc), provider.endpoint_uri)[:200],
                        len(wanted),
                    )
                    lists = False
                if lists:
                    if not all(isinstance(receipts, list) for receipts in lists):
                        raise ValueError("eth_getBlockReceipts: a block without its receipts")
                    return successful_transactions([r for receipts in lists for r in receipts], wanted=wanted)
                if lists is None:
                    self._without_block_receipts.add(provider.endpoint_uri)
                self.calls += 1
            receipts = answers(provider, [("eth_getTransactionReceipt", [tx_hash]) for tx_hash in sorted(wanted)])
            if receipts is None:
                raise RpcError({"message": "no receipts at all"})
            return successful_transactions(receipts, wanted=wanted)

        return self._send(send, "eth_getBlockReceipts")

    def native_balances(self, addresses: list[str], *, block: int) -> tuple[tuple[str, int], list[tuple[int, int]]]:
        """The (hash, timestamp) of `block`, and each address's (balance, nonce) there, in one batched round trip
        (more past MAX_BATCH calls)."""
        calls = [("eth_getBlockByNumber", [hex(block), False])]
        for address in addresses:
            calls += [("eth_getBalance", [address, hex(block)]), ("eth_getTransactionCount", [address, hex(block)])]
        results = self.batch(calls, [parse_block_ref] + [parse_uint256] * (len(calls) - 1))
        pairs = [(results[1 + 2 * position], results[2 + 2 * position]) for position in range(len(addresses))]
        return results[0], pairs

    def blocks(self, numbers: list[int]) -> dict[int, tuple[str, int]]:
        """The canonical (hash, timestamp) of each block (("", 0) for a block the node does not have), in batched
        round trips."""
        wanted = sorted(set(numbers))
        results = self.batch([("eth_getBlockByNumber", [hex(number), False]) for number in wanted], parse_block_ref)
        return dict(zip(wanted, results, strict=True))

    def address_used(self, address: str) -> bool:
        """Whether an address holds native coin or has sent a transaction (its nonce), in one batched round trip."""
        balance, nonce = self.batch(
            [("eth_getBalance", [address, "latest"]), ("eth_getTransactionCount", [address, "latest"])], parse_uint256
        )
        return balance > 0 or nonce > 0

    def contract_facts(self, addresses: list[str]) -> dict[str, tuple[bool, int | None]]:
        """For each address: whether it holds code, and what `decimals()` answers (None when nothing readable),
        in one batched round trip."""
        calls = []
        for address in addresses:
            calls += [
                ("eth_getCode", [address, "latest"]),
                ("eth_call", [{"to": address, "data": DECIMALS_CALL}, "latest"]),
            ]
        results = self._batch_tolerant(calls)
        facts = {}
        for position, address in enumerate(addresses):
            code, decimals = results[2 * position], results[2 * position + 1]
            try:
                value = int(decimals, 16) if isinstance(decimals, str) and decimals not in ("0x", "") else None
            except ValueError:
                value = None
            facts[address] = (isinstance(code, str) and code not in ("0x", "0x0", ""), value)
        return facts

    def _batch_tolerant(self, requests_: list[tuple[str, list]]) -> list:
        """A batch whose calls may each fail (a call to an address without code reverts): a failed call is None.
        A call the URL cannot answer yet (a backend behind the block asked: "header not found") is that URL's
        failure, not a failed call: the next URL is asked, and ChainUnavailable when none holds the block."""

        def send(provider):
            responses = provider.make_batch_request(requests_)
            if not isinstance(responses, list) or len(responses) != len(requests_):
                raise RpcError(responses.get("error") if isinstance(responses, dict) else {"message": "bad batch"})
            for response in responses:
                if isinstance(response, dict) and says_behind_head(response.get("error")):
                    raise RpcError(response["error"])
            return [response.get("result") if isinstance(response, dict) else None for response in responses]

        return self._send(send, "eth_call")

    def feed_round(self, feed: str) -> FeedRound:
        """A Chainlink-style aggregator's latest round, its decimals and description, and whether the address holds
        code at all, in one batched round trip. Raises ChainUnavailable only when the node does not answer; what
        the feed answered is for the caller to judge."""
        calls = [("eth_getCode", [feed, "latest"])] + [
            ("eth_call", [{"to": feed, "data": _keccak_hex(signature)[:10]}, "latest"])
            for signature in ("decimals()", "latestRoundData()", "description()")
        ]
        code, decimals, latest_round, description = self.batch(calls)
        return parse_feed_round(code=code, decimals=decimals, latest_round=latest_round, description=description)

    def transaction_and_receipt(self, tx_hash: str) -> tuple[object, object]:
        """A transaction and its receipt as the node answers them (None for what it does not know: unknown, or not
        mined yet), in one batched round trip. What they claim is for the caller to judge
        (payments/tx_hints.py)."""
        transaction, receipt = self.batch(
            [("eth_getTransactionByHash", [tx_hash]), ("eth_getTransactionReceipt", [tx_hash])]
        )
        return transaction, receipt

    # --- the balance safety net (payments/balances.py) --------------------------------------------------------
    # Calls aggregated in one Multicall3 eth_call (well within a node's eth_call gas cap for balanceOf reads).
    MULTICALL_SIZE = 500

    def token_balances(self, holdings: list[tuple[str, str]], *, block: int) -> list[int | None]:
        """`balanceOf(holder)` of each (token, holder) at `block`: None where the token's answer is not one
        readable word (a call that reverts, a token that answers nothing). Through the chain's Multicall3 where
        the chains file names it (one eth_call for many), else in batched round trips of eth_call."""
        selector = _keccak_hex("balanceOf(address)")[:10]
        datas = [(token, selector + _address_topic(holder)[2:]) for token, holder in holdings]
        if self.chain.multicall3:
            balances = self._multicall_words(datas, block=block)
            if balances is not None:
                return balances
        size = max(1, min(MAX_BATCH, self.chain.max_batch))
        calls = [("eth_call", [{"to": token, "data": data}, hex(block)]) for token, data in datas]
        balances = []
        for offset in range(0, len(calls), size):
            for result in self._batch_tolerant(calls[offset : offset + size]):
                try:
                    balances.append(parse_uint256(result))
                except ValueError:
                    balances.append(None)
        return balances

    def _multicall_words(self, datas: list[tuple[str, str]], *, block: int) -> list[int | None] | None:
        """Each (target, call data) answered through Multicall3's `aggregate3` (failures allowed), as one 32-byte
        word each (None for a failed call or another answer), `MULTICALL_SIZE` calls an eth_call, in one batched
        round trip. None when the aggregate itself cannot be read (no contract there, a malformed answer): the
        caller reads them one by one instead."""
        selector = _keccak_hex("aggregate3((address,bool,bytes)[])")[:10]
        codec = Web3().codec
        calls = []
        for offset in range(0, len(datas), self.MULTICALL_SIZE):
            part = [
                (checksum(target), True, bytes.fromhex(data.removeprefix("0x")))
                for target, data in datas[offset : offset + self.MULTICALL_SIZE]
            ]
            encoded = "0x" + codec.encode(["(address,bool,bytes)[]"], [part]).hex()
            calls.append(("eth_call", [{"to": self.chain.multicall3, "data": selector + encoded[2:]}, hex(block)]))
        words: list[int | None] = []
        size = max(1, min(MAX_BATCH, self.chain.max_batch))
        for offset in range(0, len(calls), size):
            for result in self._batch_tolerant(calls[offset : offset + size]):
                try:
                    (answers,) = codec.decode(["(bool,bytes)[]"], bytes.fromhex(result.removeprefix("0x")))
                except Exception:  # no contract (an empty answer), or not Multicall3's: read one by one
                    logger.warning(
                        "chain %s: Multicall3 at %s did not answer", self.chain.chain_id, self.chain.multicall3
                    )
                    return None
                words += [
                    int.from_bytes(answer, "big") if success and len(answer) == 32 else None
                    for success, answer in answers
                ]
        return words if len(words) == len(datas) else None

    def token_transfers_to(self, *, token: str, address: str, start: int, end: int) -> tuple[list[TransferLog], int]:
        """The Transfer logs of `token` to `address` in [start, end] (filtered by the node: contract and recipient
        topic), with the timestamp of block `start`, in one batched round trip; the range's last header comes in
        the same batch, so that a node behind `end` cannot answer less than asked (RangeNotReady). RangeRefused
        when the provider finds the range too wide."""
        query = {
            "fromBlock": hex(start),
            "toBlock": hex(end),
            "address": [token],
            "topics": [TRANSFER_TOPIC, None, _address_topic(address)],
        }

        def covered(header) -> None:
            if header is None:
                raise Lagging(f"block {end}, the end of the range, not served with its logs")
            if parse_quantity(header.get("number") if isinstance(header, dict) else None) != end:
                raise ValueError(f"asked for block {end}, answered another")

        raw, _covered, (_hash, start_time) = self._batch(
            [
                ("eth_getLogs", [query]),
                ("eth_getBlockByNumber", [hex(end), False]),
                ("eth_getBlockByNumber", [hex(start), False]),
            ],
            [parse_log_list, covered, parse_block_ref],
        )
        tokens = frozenset({token})
        logs = [log for entry in raw if (log := parse_transfer_log(entry, tokens=tokens)) is not None]
        return [log for log in logs if log.recipient == address], start_time

    def native_balance_at(self, address: str, *, block: int) -> int:
        """The native balance of `address` at `block`: one round trip."""
        return self.request("eth_getBalance", [address, hex(block)], parse_uint256)


def checksum(address: str) -> str:
    return Web3.to_checksum_address(address)


def is_address(value: str) -> bool:
    return Web3.is_address(value)


def contract_deploy_data(abi: list, bytecode: str, *args) -> str:
    """The data of a transaction that deploys a contract (its bytecode, then its constructor's arguments, ABI-encoded):
    for the development chain (payments/chain_demo.py), which deploys the project's own contracts."""
    return Web3().eth.contract(abi=abi, bytecode=bytecode).constructor(*args).data_in_transaction


def contract_call_data(abi: list, function: str, *args) -> str:
    """The data of a call of `function` of a contract with that ABI, its arguments ABI-encoded."""
    return Web3().eth.contract(abi=abi).encode_abi(function, args=list(args))
