"""System checks of the payments' settings: the account key (PAYMENTS_XPUB) and the chains file, read and validated
by `payments_settings` with every `manage.py check` (bin/web, bin/worker and bin/beat run it before they start, and
refuse to start on an error): production refuses a missing chains file, a file that does not parse, the demo
chain, its tokens and the demo key, and any key that is not an account-level xpub (a private one above all).

And of the chains file against the chains themselves: every allow-listed token holds a contract whose
`decimals()` is the one configured, every rate feed holds a contract. A wrong `decimals` would price every invoice
in that token by a power of ten.

They ask the RPC nodes, so they run with `manage.py check --deploy` and when a worker starts (logged), not with
every management command. A chain that does not answer is a warning: it may be down for a moment."""

import logging

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ImproperlyConfigured

from payments import config
from payments.addresses import DEMO_ACCOUNT_XPUB, InvalidXpub, validate_account_xpub
from payments.chain import ChainClient, ChainUnavailable

logger = logging.getLogger(__name__)


def payments_settings(app_configs=None, **kwargs) -> list[CheckMessage]:
    """PAYMENTS_CHAINS_FILE and PAYMENTS_XPUB, read and validated (no network)."""
    errors: list[CheckMessage] = []
    if not settings.PAYMENTS_CHAINS_FILE:
        errors.append(
            Error(
                "PAYMENTS_CHAINS_FILE must name the chains file when DEBUG is off.",
                hint='List the chains and assets you accept in a TOML file (docs/operations.md, "Payments").',
                id="payments.E005",
            )
        )
    else:
        try:
            config.chains()
        except ImproperlyConfigured as exc:
            errors.append(Error(str(exc), id="payments.E001"))
    xpub = config.account_xpub()
    hint = "Export the account-level extended public key m/44'/60'/0' of your wallet (docs/operations.md, \"xpub\")."
    if not xpub:
        errors.append(Error("PAYMENTS_XPUB must be set when DEBUG is off.", hint=hint, id="payments.E007"))
    elif settings.REFUSE_DEMO_PIECES and xpub == DEMO_ACCOUNT_XPUB:
        errors.append(
            Error("PAYMENTS_XPUB is the demo key (from a public test mnemonic): set your own.", id="payments.E006")
        )
    else:
        try:
            validate_account_xpub(xpub)
        except InvalidXpub as exc:
            errors.append(Error(f"PAYMENTS_XPUB: {exc}", hint=hint, id="payments.E007"))
    return errors


def chain_contracts_match_the_chains_file(app_configs=None, **kwargs) -> list[CheckMessage]:
    try:
        chains = config.chains()
    except ImproperlyConfigured:
        return []  # payments_settings says why (payments.E001, E005)
    messages: list[CheckMessage] = []
    for chain in chains.values():
        addresses = sorted({asset.contract for asset in chain.assets if asset.contract})
        addresses += sorted({asset.rate_feed for asset in chain.assets if asset.rate_feed} - set(addresses))
        if not addresses:
            continue
        try:
            facts = ChainClient(chain, timeout=3.0, backoff=0.1).contract_facts(addresses)
        except ChainUnavailable as exc:
            messages.append(
                Warning(f"chain {chain.chain_id}: its contracts could not be checked ({exc})", id="payments.W001")
            )
            continue
        for asset in chain.assets:
            if asset.contract:
                has_code, decimals = facts[asset.contract]
                where = f"chain {chain.chain_id}, {asset.symbol}"
                if not has_code:
                    messages.append(Error(f"{where}: no contract at {asset.contract}", id="payments.E002"))
                elif decimals != asset.decimals:
                    messages.append(
                        Error(
                            f"{where}: the chains file says {asset.decimals} decimals, the token's decimals() "
                            f"answers {decimals if decimals is not None else 'nothing readable'}",
                            id="payments.E003",
                        )
                    )
            if asset.rate_feed and not facts[asset.rate_feed][0]:
                messages.append(
                    Error(
                        f"chain {chain.chain_id}, {asset.symbol}: no contract at the rate feed {asset.rate_feed}",
                        id="payments.E004",
                    )
                )
    return messages


def log_chain_checks(**kwargs) -> None:
    """At a worker's start: what the checks find goes to the log (the worker starts anyway; the scan needs it)."""
    for message in payments_settings() + chain_contracts_match_the_chains_file():
        (logger.error if message.is_serious() else logger.warning)("%s: %s", message.id, message.msg)
