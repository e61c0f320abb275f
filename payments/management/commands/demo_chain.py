import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from booking.models import Order
from payments.chain import ChainUnavailable
from payments.demo import demo_client, deploy_demo_contracts, pay_invoice
from payments.selectors import current_invoice, format_units


class Command(BaseCommand):
    help = "Demo chain (development only): `setup` deploys the demo tokens; `pay BN-XXXX` pays an order's invoice."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("setup", help="wait for anvil, deploy the demo contracts, set the demo rates")
        pay = sub.add_parser("pay", help="pay an order's current invoice from anvil account 1")
        pay.add_argument("order", help="order number, e.g. BN-7K3Q9XAB")
        pay.add_argument("--units", type=int, help="base units to send (default: the amount still due)")

    def handle(self, *args, **options):
        if not settings.DEBUG:
            raise CommandError("demo_chain drives a development chain: it runs only with DEBUG on.")
        client = demo_client()
        for _attempt in range(60):
            try:
                client.head()
                break
            except ChainUnavailable:
                time.sleep(0.5)
        else:
            raise CommandError(f"no answer from {client.chain.rpc_urls[0]}: is anvil running (make run)?")
        if options["action"] == "setup":
            for symbol, address in deploy_demo_contracts(client).items():
                self.stdout.write(f"demo chain {client.chain.chain_id}: {symbol} at {address}")
            return
        order = Order.objects.filter(public_id=options["order"].strip().upper()).first()
        invoice = current_invoice(order) if order else None
        if invoice is None:
            raise CommandError(f"no invoice for order {options['order']!r}")
        tx_hash = pay_invoice(client, invoice, units=options["units"])
        units = options["units"] or invoice.amount_missing_units or invoice.amount_due_units
        self.stdout.write(
            f"sent {format_units(units, invoice.asset_decimals)} {invoice.asset_symbol} to {invoice.deposit_address}"
            f" in {tx_hash} (demo wallet: anvil account 1)"
        )
