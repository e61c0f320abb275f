"""The demo chain of `make run` and the tests: deploy the project's contracts on a fresh anvil at the addresses
payments/chains.demo.toml names, set the demo rates, pay an invoice from a funded anvil account. DEMO ONLY: it
runs against a development chain whose accounts the node unlocks."""

from decimal import Decimal

from django.conf import settings

from payments import config
from payments.chain_demo import DevChain
from payments.models import Invoice, OperatorRate

DEMO_CHAIN_ID = 31337
DEMO_USDT_RATE = Decimal("0.92")  # EUR per dUSDT, operator-set in the demo
DEMO_ETH_EUR = 2500 * 10**8  # the aggregator's answer (8 decimals)
CONTRACTS = [  # deployed in this order from account 0: nonces 0, 1, 2 give the configured addresses
    ("DemoStablecoin", ("Demo Euro Coin", "dEURC", 6), "dEURC"),
    ("NoReturnToken", ("Demo Tether", "dUSDT", 6), "dUSDT"),
    ("MockAggregator", (8, DEMO_ETH_EUR, "ETH / EUR"), "ETH"),
]


def demo_client(chain: config.Chain | None = None) -> DevChain:
    chain = chain or config.chain(DEMO_CHAIN_ID)
    if chain is None:
        raise RuntimeError(f"chain {DEMO_CHAIN_ID} is not in {settings.PAYMENTS_CHAINS_FILE}")
    return DevChain(chain)


def deploy_demo_contracts(client: DevChain) -> dict[str, str]:
    """Deploy (once) and check that each contract landed where the chains file says. Returns symbol → address."""
    chain = client.chain
    deployer = client.accounts()[0]
    deployed = {}
    for name, args, symbol in CONTRACTS:
        asset = chain.asset(symbol)
        expected = asset.contract or asset.rate_feed
        if client.request("eth_getCode", [expected, "latest"]) in ("0x", "0x0", None):
            address = client.deploy(name, *args, sender=deployer)
            if address != expected:
                raise RuntimeError(
                    f"{name} deployed at {address}, the chains file expects {expected}: start from a fresh chain"
                )
        deployed[symbol] = expected
    OperatorRate.objects.update_or_create(
        chain_id=chain.chain_id,
        asset_symbol="dUSDT",
        fiat_currency=settings.PRICE_CURRENCY,
        defaults={"rate": DEMO_USDT_RATE},
    )
    return deployed


def pay_invoice(client: DevChain, invoice: Invoice, *, units: int | None = None, payer_index: int = 1) -> str:
    """Send `units` (default: what is still due) of the invoice's asset from a funded anvil account."""
    units = int(units if units is not None else (invoice.amount_missing_units or invoice.amount_due_units))
    payer = client.accounts()[payer_index]
    if invoice.asset_contract:
        contract = "NoReturnToken" if invoice.asset_symbol == "dUSDT" else "DemoStablecoin"
        if client.balance_of(invoice.asset_contract, payer) < units:
            client.mint(invoice.asset_contract, payer, units, sender=payer, contract=contract)
        receipt = client.send_token(
            invoice.asset_contract, invoice.deposit_address, units, sender=payer, contract=contract
        )
    else:
        receipt = client.send_native(invoice.deposit_address, units, sender=payer)
    return receipt["transactionHash"]
