"""System checks of the chains file against the chains themselves: every allow-listed token holds a contract whose
`decimals()` is the one configured, every rate feed holds a contract. A wrong `decimals` would price every invoice
in that token by a power of ten.

They ask the RPC nodes, so they run with `manage.py check --deploy` and when a worker starts (logged), not with
every management command. A chain that does not answer is a warning: it may be down for a moment."""

import logging

from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ImproperlyConfigured

from payments import config
from payments.chain import ChainClient, ChainUnavailable

logger = logging.getLogger(__name__)


def chain_contracts_match_the_chains_file(app_configs=None, **kwargs) -> list[CheckMessage]:
    try:
        chains = config.chains()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="payments.E001")]
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
    for message in chain_contracts_match_the_chains_file():
        (logger.error if message.is_serious() else logger.warning)("%s: %s", message.id, message.msg)
