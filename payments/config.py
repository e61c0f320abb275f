"""The chains file: which EVM chains and assets Binôme accepts (settings.PAYMENTS_CHAINS_FILE, TOML).

    [[chains]]
    chain_id = 1
    name = "Ethereum"
    rpc_urls = ["https://rpc-1.example", "https://rpc-2.example"]   # in order of preference
    confirmations = 12                 # or: finality = "finalized"
    explorer_tx_url = "https://etherscan.io/tx/{tx}"
    native_symbol = "ETH"
    max_block_range = 2000             # largest eth_getLogs range asked at once (the providers' cap, if lower)
    max_batch = 1000                   # most calls in one JSON-RPC batch (the providers' cap, if lower)
    multicall3 = "0xcA11…"             # optional: Multicall3 on this chain; token balances are read through it

      [[chains.assets]]
      symbol = "USDC"
      contract = "0xA0b8…"             # an allow-listed ERC-20; omit for the native coin
      decimals = 6
      pegged_to = "EUR"                # a stablecoin in the price currency, at par; or:
      rate_feed = "0x…"                # a Chainlink-style aggregator (fiat per coin); or neither: operator-set rate
      rate_feed_heartbeat = 3600       # seconds: an answer older than this is refused (the feed's heartbeat)
      rate_feed_base = "ETH"           # the coin the feed prices, when its description names it otherwise than
                                       # the symbol (e.g. "MATIC" for POL); default: the symbol

RPC URLs may name environment variables, `${NAME}` or `${NAME:-default}`, so that provider keys stay out of the
file. Loaded when first needed, once per process (again when the file changes), and validated on load: a mistake is
an error with its message, never a wrong address. The settings only name the file; `manage.py check` (and bin/web,
bin/worker, bin/beat before they start) loads it, so a process refuses to start on a mistake (payments/checks.py).
"""

import os
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(value: str, *, path: Path) -> str:
    def replace(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is None:
            raise _fail(path, f"environment variable {name} is not set")
        return default

    return _VARIABLE.sub(replace, value)


@dataclass(frozen=True)
class Asset:
    chain_id: int
    symbol: str
    decimals: int
    contract: str = ""  # lower-case hex; empty for the native coin
    pegged_to: str = ""
    rate_feed: str = ""
    rate_feed_heartbeat: int = 3600
    rate_feed_base: str = ""  # the base the feed's description must name; empty: the symbol

    @property
    def is_native(self) -> bool:
        return not self.contract

    @property
    def key(self) -> str:
        return f"{self.chain_id}:{self.symbol}"


@dataclass(frozen=True)
class Chain:
    chain_id: int
    name: str
    rpc_urls: tuple[str, ...]
    confirmations: int = 12
    finality: str = ""  # "finalized" to use the node's finalized tag instead of a block count
    explorer_tx_url: str = ""
    explorer_address_url: str = ""
    native_symbol: str = "ETH"
    max_block_range: int = 2000
    max_batch: int = 1000
    assets: tuple[Asset, ...] = field(default_factory=tuple)
    multicall3: str = ""  # lower-case hex; empty: token balances are read by a batch of eth_call

    def asset(self, symbol: str) -> Asset | None:
        return next((asset for asset in self.assets if asset.symbol == symbol), None)

    @property
    def token_contracts(self) -> dict[str, Asset]:
        return {asset.contract: asset for asset in self.assets if asset.contract}

    def tx_url(self, tx_hash: str) -> str:
        return self.explorer_tx_url.format(tx=tx_hash) if self.explorer_tx_url and tx_hash.startswith("0x") else ""

    def address_url(self, address: str) -> str:
        return self.explorer_address_url.format(address=address) if self.explorer_address_url else ""


# The demo pieces a production chains file must not carry: anvil's chain id, and the contracts deployed from anvil's
# account 0 (a public key: anyone can deploy at these addresses on any chain), whose demo tokens anyone can mint.
DEMO_CHAIN_ID = 31337
DEMO_CONTRACTS = frozenset(
    {
        "0x5fbdb2315678afecb367f032d93f642f64180aa3",  # dEURC
        "0xe7f1725e7734ce288f8367e1bb143e90bb3f0512",  # dUSDT
        "0x9fe46736679d2d9a65f0992f2272de9f3c7fa6e0",  # ETH/EUR rate feed
    }
)
DEMO_CHAINS_FILE = Path(__file__).resolve().parent / "chains.demo.toml"


def refuse_demo_pieces(chains_by_id: dict[int, "Chain"], *, path: Path) -> None:
    """Production (DEBUG off) refuses the demo chain and its faucet tokens."""
    if path.resolve() == DEMO_CHAINS_FILE:
        raise _fail(path, "this is the demo chains file (a local anvil and its faucet tokens): list your own chains")
    if DEMO_CHAIN_ID in chains_by_id:
        raise _fail(path, f"chain {DEMO_CHAIN_ID} is anvil's local demo chain, refused in production")
    for configured in chains_by_id.values():
        for listed in configured.assets:
            if listed.contract in DEMO_CONTRACTS or listed.rate_feed in DEMO_CONTRACTS:
                raise _fail(path, f"chain {configured.chain_id}, {listed.symbol}: a demo contract (anyone can mint it)")


def _fail(path: Path, message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{path}: {message}")


def parse_chains(text: str, *, path: Path = Path("<chains>")) -> dict[int, Chain]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _fail(path, f"not valid TOML ({exc})") from exc
    chains: dict[int, Chain] = {}
    for raw in data.get("chains", []):
        chain_id = raw.get("chain_id")
        if not isinstance(chain_id, int) or chain_id <= 0:
            raise _fail(path, f"chain_id must be a positive integer, not {chain_id!r}")
        if chain_id in chains:
            raise _fail(path, f"chain {chain_id} is listed twice")
        rpc_urls = tuple(_expand(url, path=path) if isinstance(url, str) else url for url in raw.get("rpc_urls", ()))
        if not rpc_urls or not all(
            isinstance(url, str) and url.startswith(("http://", "https://")) for url in rpc_urls
        ):
            raise _fail(path, f"chain {chain_id}: rpc_urls must list http(s) URLs")
        finality = raw.get("finality", "")
        if finality not in ("", "finalized"):
            raise _fail(path, f"chain {chain_id}: finality is either absent or 'finalized'")
        confirmations = raw.get("confirmations", 12)
        if not isinstance(confirmations, int) or not 1 <= confirmations <= 1000:
            raise _fail(path, f"chain {chain_id}: confirmations must be between 1 and 1000")
        limits = {}
        for name, upper in (("max_block_range", 100_000), ("max_batch", 1000)):
            value = raw.get(name, 2000 if name == "max_block_range" else 1000)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= upper:
                raise _fail(path, f"chain {chain_id}: {name} must be an integer from 1 to {upper}")
            limits[name] = value
        assets = []
        for raw_asset in raw.get("assets", []):
            symbol = raw_asset.get("symbol", "")
            if not re.fullmatch(r"[A-Za-z0-9.]{1,12}", symbol or ""):
                raise _fail(path, f"chain {chain_id}: asset symbol {symbol!r} is not valid")
            contract = raw_asset.get("contract", "")
            if contract and not _ADDRESS.fullmatch(contract):
                raise _fail(path, f"chain {chain_id}, {symbol}: contract {contract!r} is not an address")
            decimals = raw_asset.get("decimals", 18 if not contract else None)
            if not isinstance(decimals, int) or not 0 <= decimals <= 36:
                raise _fail(path, f"chain {chain_id}, {symbol}: decimals must be an integer from 0 to 36")
            rate_feed = raw_asset.get("rate_feed", "")
            if rate_feed and not _ADDRESS.fullmatch(rate_feed):
                raise _fail(path, f"chain {chain_id}, {symbol}: rate_feed {rate_feed!r} is not an address")
            heartbeat = raw_asset.get("rate_feed_heartbeat", 3600)
            if not isinstance(heartbeat, int) or isinstance(heartbeat, bool) or not 60 <= heartbeat <= 7 * 86400:
                raise _fail(path, f"chain {chain_id}, {symbol}: rate_feed_heartbeat must be 60 to 604800 seconds")
            feed_base = raw_asset.get("rate_feed_base", "")
            if feed_base and not re.fullmatch(r"[A-Za-z0-9.]{1,12}", str(feed_base)):
                raise _fail(path, f"chain {chain_id}, {symbol}: rate_feed_base {feed_base!r} is not a symbol")
            assets.append(
                Asset(
                    chain_id=chain_id,
                    symbol=symbol,
                    decimals=decimals,
                    contract=contract.lower(),
                    pegged_to=raw_asset.get("pegged_to", ""),
                    rate_feed=rate_feed.lower(),
                    rate_feed_heartbeat=heartbeat,
                    rate_feed_base=str(feed_base),
                )
            )
        if len({asset.symbol for asset in assets}) != len(assets):
            raise _fail(path, f"chain {chain_id}: an asset symbol is listed twice")
        multicall3 = raw.get("multicall3", "")
        if multicall3 and not (isinstance(multicall3, str) and _ADDRESS.fullmatch(multicall3)):
            raise _fail(path, f"chain {chain_id}: multicall3 {multicall3!r} is not an address")
        chains[chain_id] = Chain(
            chain_id=chain_id,
            name=str(raw.get("name") or f"Chain {chain_id}"),
            rpc_urls=rpc_urls,
            confirmations=confirmations,
            finality=finality,
            explorer_tx_url=raw.get("explorer_tx_url", ""),
            explorer_address_url=raw.get("explorer_address_url", ""),
            native_symbol=raw.get("native_symbol", "ETH"),
            max_block_range=limits["max_block_range"],
            max_batch=limits["max_batch"],
            assets=tuple(assets),
            multicall3=multicall3.lower(),
        )
    return chains


@cache
def _load(path: str, mtime: float, production: bool) -> dict[int, Chain]:
    return load_chains_file(Path(path), production=production)


def load_chains_file(file: Path, *, production: bool) -> dict[int, Chain]:
    try:
        text = file.read_text()
    except OSError as exc:
        raise _fail(file, f"cannot be read ({exc})") from exc
    loaded = parse_chains(text, path=file)
    if production:
        refuse_demo_pieces(loaded, path=file)
    return loaded


def chains() -> dict[int, Chain]:
    """The configured chains by chain id (reloaded when the file changes)."""
    path = Path(settings.PAYMENTS_CHAINS_FILE)
    return _load(str(path), path.stat().st_mtime if path.exists() else 0.0, settings.REFUSE_DEMO_PIECES)


def account_xpub() -> str:
    """The account-level xpub deposit addresses derive from: PAYMENTS_XPUB, or in development (DEBUG on) the demo
    key when it is unset. Checked when a process starts (payments/checks.py), not here."""
    if settings.PAYMENTS_XPUB or settings.REFUSE_DEMO_PIECES:
        return settings.PAYMENTS_XPUB
    from payments.addresses import DEMO_ACCOUNT_XPUB

    return DEMO_ACCOUNT_XPUB


def chain(chain_id: int) -> Chain | None:
    return chains().get(chain_id)


def asset(chain_id: int, symbol: str) -> Asset | None:
    found = chain(chain_id)
    return found.asset(symbol) if found else None


def assets() -> list[Asset]:
    return [asset for configured in chains().values() for asset in configured.assets]
