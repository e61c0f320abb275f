"""The chains file checked against the chains: token decimals and contracts, rate feeds (manage.py check --deploy
and a worker's start), on anvil."""

import logging

from payments.checks import chain_contracts_match_the_chains_file, log_chain_checks
from tests.payments.conftest import chains_toml, free_port

DEMO_EURC = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
DEMO_FEED = "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0"


def use(settings, tmp_path, text: str) -> None:
    path = tmp_path / "checked.toml"
    path.write_text(text)
    settings.PAYMENTS_CHAINS_FILE = str(path)


def test_the_demo_chains_file_matches_the_demo_chain(chain):
    assert chain_contracts_match_the_chains_file() == []


def test_wrong_decimals_a_token_without_code_and_a_feed_without_code_are_errors(chain, settings, tmp_path):
    text = chains_toml(chain.chain.rpc_urls[0])
    text = text.replace(
        'contract = "0x5FbDB2315678afecb367f032d93F642f64180aa3"\n  decimals = 6',
        f'contract = "{DEMO_EURC}"\n  decimals = 18',
    )
    text = text.replace('contract = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"', 'contract = "0x' + "34" * 20 + '"')
    text = text.replace(DEMO_FEED, "0x" + "56" * 20)
    use(settings, tmp_path, text)

    messages = {message.id: message.msg for message in chain_contracts_match_the_chains_file()}

    assert messages["payments.E003"] == (
        "chain 31337, dEURC: the chains file says 18 decimals, the token's decimals() answers 6"
    )
    assert messages["payments.E002"] == "chain 31337, dUSDT: no contract at 0x" + "34" * 20
    assert messages["payments.E004"] == "chain 31337, ETH: no contract at the rate feed 0x" + "56" * 20


def test_a_chain_that_does_not_answer_is_a_warning_logged_at_a_workers_start(db, settings, tmp_path, caplog):
    use(settings, tmp_path, chains_toml(f"http://127.0.0.1:{free_port()}"))

    with caplog.at_level(logging.WARNING, logger="payments.checks"):
        log_chain_checks()

    assert [message.id for message in chain_contracts_match_the_chains_file()] == ["payments.W001"]
    assert "payments.W001: chain 31337: its contracts could not be checked" in caplog.text


def test_the_payments_settings_are_checked_without_a_chain(settings, tmp_path):
    """`manage.py check` (and each process before it starts) reads the chains file and the xpub the settings name:
    clean in development, every refusal of production with its own id."""
    from payments.addresses import DEMO_ACCOUNT_XPUB
    from payments.checks import payments_settings

    settings.PAYMENTS_XPUB = ""
    assert payments_settings() == []  # development: the demo chains file and the demo key

    settings.REFUSE_DEMO_PIECES = True  # what DEBUG off sets
    refused = {message.id: message.msg for message in payments_settings()}
    assert refused["payments.E001"].endswith(
        "this is the demo chains file (a local anvil and its faucet tokens): list your own chains"
    )
    assert refused["payments.E007"] == "PAYMENTS_XPUB must be set when DEBUG is off."

    settings.PAYMENTS_XPUB = DEMO_ACCOUNT_XPUB
    settings.PAYMENTS_CHAINS_FILE = ""
    refused = {message.id: message.msg for message in payments_settings()}
    assert refused == {
        "payments.E005": "PAYMENTS_CHAINS_FILE must name the chains file when DEBUG is off.",
        "payments.E006": "PAYMENTS_XPUB is the demo key (from a public test mnemonic): set your own.",
    }

    use(settings, tmp_path, "[[chains]]\nchain_id = 'one'\n")
    assert [message.id for message in payments_settings()] == ["payments.E001", "payments.E006"]
    assert chain_contracts_match_the_chains_file() == []  # said once, by payments.E001
