"""The chains file: validated on load, a mistake is a clear stop, never a wrong address."""

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from payments.config import parse_chains

DEMO = (Path(__file__).resolve().parents[2] / "payments" / "chains.demo.toml").read_text()


def test_the_demo_file_lists_a_stablecoin_a_token_without_return_value_and_the_native_coin(monkeypatch):
    monkeypatch.delenv("DEMO_RPC_URL", raising=False)
    chain = parse_chains(DEMO)[31337]
    assert chain.rpc_urls == ("http://127.0.0.1:8545",)
    assert [(a.symbol, a.is_native, a.pegged_to) for a in chain.assets] == [
        ("dEURC", False, "EUR"),
        ("dUSDT", False, ""),
        ("ETH", True, ""),
    ]
    assert chain.asset("dEURC").contract == "0x5fbdb2315678afecb367f032d93f642f64180aa3"


def test_rpc_urls_take_provider_keys_from_the_environment(monkeypatch):
    monkeypatch.setenv("DEMO_RPC_URL", "https://rpc.example/v3/secret-key")
    assert parse_chains(DEMO)[31337].rpc_urls == ("https://rpc.example/v3/secret-key",)

    text = DEMO.replace("${DEMO_RPC_URL:-http://127.0.0.1:8545}", "${MISSING_PROVIDER_KEY}")
    with pytest.raises(ImproperlyConfigured, match="MISSING_PROVIDER_KEY is not set"):
        parse_chains(text)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("chain_id = 31337", "chain_id = -1"), "chain_id must be a positive integer"),
        (('contract = "0x5FbDB2315678afecb367f032d93F642f64180aa3"', 'contract = "0x5FbD"'), "is not an address"),
        (("confirmations = 3", "confirmations = 0"), "confirmations must be between 1 and 1000"),
        (('symbol = "dUSDT"', 'symbol = "dEURC"'), "listed twice"),
        (("decimals = 6", "decimals = 99"), "decimals must be an integer"),
        (("[[chains]]", "[[chains]"), "not valid TOML"),
        (("${DEMO_RPC_URL:-http://127.0.0.1:8545}", "ftp://node"), r"rpc_urls must list http\(s\) URLs"),
        (("confirmations = 3", 'confirmations = 3\nmulticall3 = "0xcA11"'), "multicall3 '0xcA11' is not an address"),
    ],
)
def test_mistakes_stop_with_a_message(change, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_chains(DEMO.replace(*change, 1))
