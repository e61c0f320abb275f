"""A real EVM node for the payment tests: anvil (npm @foundry-rs/anvil) with the project's contracts compiled
from source by solc-js, deployed once per session; each test runs on a snapshot that is reverted after it."""

import dataclasses
import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from payments import config
from payments.chain import ChainUnavailable
from payments.chain_demo import DevChain
from payments.demo import CONTRACTS, DEMO_USDT_RATE
from payments.models import OperatorRate

ROOT = Path(__file__).resolve().parents[2]
DEMO_CHAINS = (ROOT / "payments" / "chains.demo.toml").read_text()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chains_toml(*rpc_urls: str, confirmations: int = 3) -> str:
    urls = ", ".join(f'"{url}"' for url in rpc_urls)
    return DEMO_CHAINS.replace('rpc_urls = ["${DEMO_RPC_URL:-http://127.0.0.1:8545}"]', f"rpc_urls = [{urls}]").replace(
        "confirmations = 3", f"confirmations = {confirmations}"
    )


class Anvil:
    """An anvil node on a free port. With `state`, the chain (blocks, logs, balances it touched) is written there
    when the node stops and read back when it starts again: a node that goes down and comes back."""

    def __init__(self, state: Path | None = None, *, chain_id: int = 31337) -> None:
        self.chain_id = chain_id
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state = state
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        state = ["--state", str(self.state)] if self.state else []
        self.process = subprocess.Popen(
            [
                str(ROOT / "node_modules" / ".bin" / "anvil"),
                *("--port", str(self.port), "--chain-id", str(self.chain_id), "--silent", *state),
            ],
            start_new_session=True,
        )
        # Asked as the chain it serves (the client checks each URL's chain id).
        client = DevChain(config.parse_chains(chains_toml(self.url))[31337])
        client.chain = dataclasses.replace(client.chain, chain_id=self.chain_id)
        for _ in range(100):
            try:
                client.head()
                return
            except ChainUnavailable:
                time.sleep(0.1)
        raise RuntimeError("anvil did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)


@contextmanager
def deployed_anvil(state: Path | None = None):
    """A fresh anvil with the demo contracts at the addresses the demo chains file names (the `anvil` fixture of
    tests/conftest.py, one per session)."""
    node = Anvil(state)
    node.start()
    try:
        client = DevChain(config.parse_chains(chains_toml(node.url))[31337])
        deployer = client.accounts()[0]
        for name, args, symbol in CONTRACTS:
            asset = client.chain.asset(symbol)
            assert client.deploy(name, *args, sender=deployer) == (asset.contract or asset.rate_feed)
        yield node
    finally:
        node.stop()


@pytest.fixture
def chain(anvil, settings, tmp_path, db) -> DevChain:
    """The demo chain on the session's anvil, configured through a chains file like production's."""
    path = tmp_path / "chains.toml"
    path.write_text(chains_toml(anvil.url))
    settings.PAYMENTS_CHAINS_FILE = str(path)
    OperatorRate.objects.create(
        chain_id=31337, asset_symbol="dUSDT", fiat_currency=settings.PRICE_CURRENCY, rate=DEMO_USDT_RATE
    )
    client = DevChain(config.chain(31337))
    snapshot = client.snapshot()
    yield client
    client.revert(snapshot)


@pytest.fixture
def proxies(anvil):
    """Make LimitingProxy instances in front of the session's anvil; all are stopped after the test."""
    from tests.payments.rpc_proxy import LimitingProxy

    made = []

    def make(**kwargs) -> LimitingProxy:
        made.append(LimitingProxy(anvil.url, **kwargs))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


@pytest.fixture
def use_chains_file(settings, tmp_path):
    """Point the settings at a chains file with these RPC URLs (and optionally extra allow-listed assets)."""

    def use(*rpc_urls: str, extra_assets: str = "", name: str = "chains") -> None:
        path = tmp_path / f"{name}.toml"
        path.write_text(chains_toml(*rpc_urls) + extra_assets)
        settings.PAYMENTS_CHAINS_FILE = str(path)

    return use


@pytest.fixture
def full_refund_rules(rules):
    """The cancellation rules of the refund and invoice attacks: as money_rules, without the fee."""
    return rules(days=3, fee="0.00", percent=50)


@pytest.fixture
def money_rules(rules):
    """The cancellation rules the money machines play with: 50 % back until 3 days before, a 100.00 fee."""
    return rules(days=3, fee="100.00", percent=50)


@pytest.fixture
def machine(client, booking_data, admin_user, monkeypatch, money_rules):
    """One order's money life with the operator in it (tests/payments/money_life.py), its steps called by hand."""
    from decimal import Decimal

    from payments import fiscal
    from tests.payments.money_life import RedMoneyLife

    monkeypatch.setattr(fiscal, "_write_document", lambda fiscal_invoice_id: None)
    OperatorRate.objects.create(chain_id=31337, asset_symbol="dUSDT", fiat_currency="EUR", rate=Decimal("0.9"))
    RedMoneyLife.fixtures = {"client": client, "booking_data": booking_data, "admin": admin_user}
    life = RedMoneyLife()
    yield life
    life.teardown()
