"""Chain scanning on a real node (anvil) behind a JSON-RPC proxy that enforces common providers' limits
(tests/payments/rpc_proxy.py: 1,000 topics, batches of 1,000, 10,000 logs per answer, 2,000-block ranges).

1. RPC round trips, bytes on the wire and the largest request per scan cycle, and cycle time, for 1, 1,000 and
   10,000 open invoices, every other one in the native coin (a few payments in flight, token and native, so cycles
   read and confirm transfers);
2. detection latency with 10,000 open invoices and a block of 5,000 spam Transfer logs in the range, with a real
   Celery worker and beat (Redis broker, beat scanning every second): from the block that completes the
   confirmations to the order showing paid.

    .venv/bin/python bench/chain_scan.py            # needs PostgreSQL and Redis on 127.0.0.1, `make setup` done
    BENCH_INVOICES=1,100,1000 .venv/bin/python bench/chain_scan.py    # a quicker run
    BENCH_LOG_LEVEL=INFO .venv/bin/python bench/chain_scan.py          # and the worker logs each scan's duration

The machine's load is printed first: latency is a wall-clock figure, and another job on a small machine shows in it.

Targets (issue 11): calls per cycle constant and at most 5, request size constant; detection latency <= 2 s.
"""

import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://root@127.0.0.1:5432/binome_chainbench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
LEVELS = [int(level) for level in os.environ.get("BENCH_INVOICES", "1,1000,10000").split(",")]
LOG_LEVEL = os.environ.get("BENCH_LOG_LEVEL", "WARNING")
SPAM_LOGS = 5000


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    import psycopg

    from tests.payments.rpc_proxy import LimitingProxy

    anvil_port = free_port()
    anvil_url = f"http://127.0.0.1:{anvil_port}"
    chains_file = Path(tempfile.mkdtemp()) / "chains.toml"
    anvil = subprocess.Popen(
        [str(ROOT / "node_modules" / ".bin" / "anvil"), "--port", str(anvil_port), "--silent"],
        start_new_session=True,
    )
    proxy = LimitingProxy(anvil_url, max_range=2000)
    chains_file.write_text((ROOT / "payments" / "chains.demo.toml").read_text())
    env = {
        **os.environ,
        "DEBUG": "1",
        "DATABASE_URL": DATABASE_URL,
        "REDIS_URL": REDIS_URL,
        "PAYMENTS_CHAINS_FILE": str(chains_file),
        "DEMO_RPC_URL": proxy.url,
        "PAYMENTS_SCAN_SECONDS": "1",
        "EXPIRE_HOLDS_EVERY_SECONDS": "3600",
        "LOG_LEVEL": LOG_LEVEL,
        "EMAIL_URL": "consolemail://",
    }
    os.environ.update(env)
    name = DATABASE_URL.rsplit("/", 1)[1]
    with psycopg.connect(DATABASE_URL.rsplit("/", 1)[0] + "/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    processes = [anvil]
    from tests.processes import stop_process_groups

    try:
        import django

        os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
        django.setup()
        run(processes, env, proxy, chains_file)
    finally:
        stop_process_groups(processes, timeout=15)
        proxy.close()


def run(processes: list, env: dict, proxy, chains_file: Path) -> None:
    from django.core.cache import cache

    from booking.models import BookingPolicy, EnvironmentImage, Order, OrderStatus
    from booking.placing import BookingRequest, Contact, Research
    from booking.selectors import earliest_start_date
    from booking.ssh_keys import parse_public_key
    from booking.terms import terms_current
    from inventory.models import HardwareClass
    from payments import config, invoices
    from payments.chain import ChainClient, ChainUnavailable
    from payments.checkout import order_place
    from payments.demo import demo_client, deploy_demo_contracts, pay_invoice
    from payments.scanner import chain_scan
    from payments.selectors import current_invoice
    from provisioning.demo import seed_demo_catalog
    from tests.factories import make_ssh_key
    from tests.processes import beat_argv, worker_argv

    client = demo_client()
    for _ in range(100):
        try:
            client.head()
            break
        except ChainUnavailable:
            time.sleep(0.1)
    deploy_demo_contracts(client)
    # A hostile contract, allow-listed so that its 5,000 logs reach the scanner's parser (the worst case: the
    # node filters out the logs of contracts that are not listed).
    hostile = client.deploy("HostileEmitter", sender=client.accounts()[5])
    chains_file.write_text(
        chains_file.read_text()
        + f'\n  [[chains.assets]]\n  symbol = "dHOST"\n  contract = "{hostile}"\n  decimals = 6\n  pegged_to = "EUR"\n'
    )
    client = demo_client()
    seed_demo_catalog()
    cache.clear()
    policy = BookingPolicy.current()
    policy.max_lots_per_order = 1
    policy.save()

    def new_order() -> Order:
        order, _token = order_place(
            request=BookingRequest(
                hardware_class=HardwareClass.objects.get(slug="mi300x-pair"),
                environment=EnvironmentImage.objects.get(slug="pytorch-2-6-rocm-6-4"),
                lot_count=1,
                start_date=earliest_start_date(policy=policy) + timedelta(days=len(orders) * 5),
                days=3,
                contact=Contact(name="Bench", email="bench@example.org", organisation="Bench"),
                ssh_keys=[parse_public_key(make_ssh_key())],
                terms_version_id=terms_current().pk,
                research=Research(hypothesis="shorter_step", detail="Bench", measure="Scan cost"),
            )
        )
        orders.append(order)
        return order

    orders: list[Order] = []
    anchor = new_order()
    chain = config.chain(31337)
    print(f"anvil behind {chain.rpc_urls[0]} (limiting proxy), confirmations {chain.confirmations}")
    print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{load:.1f}' for load in os.getloadavg())}")
    print()
    print(
        f"{'open invoices':>14} {'RPC calls/cycle':>16} {'bytes/cycle':>12} {'largest request':>16} "
        f"{'cycle ms (median)':>18} {'logs':>6} {'settled':>8} {'balances read':>14}"
    )
    created = 1
    ether = chain.asset("ETH")
    for target in LEVELS:
        while created < target:
            invoices.invoice_create(order=anchor, fiat_amount=Decimal("10.00"), asset=ether if created % 2 else None)
            created += 1
        for invoice in anchor.invoices.order_by("-pk")[:3]:  # a few payments in flight
            pay_invoice(client, invoice, units=1_000000)
        calls, wire, largest, durations, logs, settled, balances = [], [], [], [], 0, 0, 0
        for _cycle in range(5):
            client.mine(1)
            proxy.reset_counts()
            scanner = ChainClient(chain)
            started = time.perf_counter()
            result = chain_scan(chain_id=31337, client=scanner)
            durations.append((time.perf_counter() - started) * 1000)
            calls.append(proxy.requests)
            wire.append(proxy.bytes_in + proxy.bytes_out)
            largest.append(proxy.largest_request)
            logs += result.logs
            settled += len(result.settled)
            balances = max(balances, result.balance_checks)
            assert not proxy.refused, proxy.refused
        print(
            f"{result.invoices:>14} {'/'.join(map(str, sorted(set(calls)))):>16} {statistics.median(wire):>12.0f} "
            f"{'/'.join(map(str, sorted(set(largest)))):>16} {statistics.median(durations):>18.1f} "
            f"{logs:>6} {settled:>8} {balances:>14}"
        )

    # Detection latency with a real worker and beat (Redis broker), beat scanning every second.
    for argv in (worker_argv(LOG_LEVEL), beat_argv(Path(tempfile.mkdtemp()) / "beat")):
        processes.append(subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True))
    time.sleep(4)
    latencies = []
    spammer = client.accounts()[5]
    for _trial in range(5):
        order = new_order()
        invoice = current_invoice(order)
        pay_invoice(client, invoice)
        client.call(
            "HostileEmitter", hostile, "spam", "0x" + "00" * 19 + "01", SPAM_LOGS, 1, sender=spammer, gas=25_000_000
        )
        client.mine(max(0, chain.confirmations - 3))  # one short of final
        time.sleep(1.5)
        client.mine(1)  # the block that completes the confirmations
        completed = time.perf_counter()
        while time.perf_counter() - completed < 30:
            order.refresh_from_db()
            if order.status == OrderStatus.PAID:
                break
            time.sleep(0.02)
        latencies.append(time.perf_counter() - completed)
        print(
            f"trial {_trial + 1}: order {order.public_id} {order.status} {latencies[-1]:.2f} s after the final block "
            f"({created + _trial + 1} open invoices, {SPAM_LOGS} spam logs in the range)"
        )
    print()
    print(
        f"detection latency: median {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s "
        f"(target <= 2 s: {'met' if max(latencies) <= 2 else 'NOT met'}; "
        f"load average {' '.join(f'{load:.1f}' for load in os.getloadavg())})"
    )


if __name__ == "__main__":
    if "SECRET_KEY" not in os.environ:
        os.environ["SECRET_KEY"] = secrets.token_urlsafe(64)
    main()
