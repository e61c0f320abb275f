"""Chain scanning on a real node (anvil) behind a JSON-RPC proxy that enforces common providers' limits
(tests/payments/rpc_proxy.py: 1,000 topics, batches of 1,000, 10,000 logs per answer, 2,000-block ranges).

1. RPC round trips, bytes on the wire and the largest request per scan cycle, and cycle time, for 1, 1,000 and
   10,000 open invoices, every other one in the native coin (a few payments in flight, token and native, so cycles
   read and confirm transfers);
2. on a made-up chain of realistic blocks (bench/synthetic_node.py: 150 transactions a block, 12 confirmations):
   a catch-up of 7,200 blocks (a day of Ethereum) in a process of its own (time, round trips, bytes, peak memory),
   then for 1 and 1,000 open invoices the bytes of a cycle when nothing changed, of a cycle with one new block, of
   the first cycle after new invoices (everything not final read in full: what every cycle cost before), of a
   cycle after a 3-block reorganisation, and what a day costs at the production scan period (10 s, 12 s blocks);
3. detection latency with 10,000 open invoices and a block of 5,000 spam Transfer logs in the range, with a real
   Celery worker and beat (Redis broker, beat scanning every second): from the block that completes the
   confirmations to the order showing paid.

    .venv/bin/python bench/chain_scan.py            # needs PostgreSQL and Redis on 127.0.0.1, `make setup` done
    BENCH_INVOICES=1,100,1000 .venv/bin/python bench/chain_scan.py    # a quicker run
    BENCH_LOG_LEVEL=INFO .venv/bin/python bench/chain_scan.py          # and the worker logs each scan's duration
    BENCH_ANVIL=0 BENCH_INVOICES=1,1000 .venv/bin/python bench/chain_scan.py   # realistic blocks only (2.)
    BENCH_DATABASE_URL=... BENCH_REDIS_URL=redis://127.0.0.1:6379/3 ...         # another database / Redis db

The machine's load is printed first: latency is a wall-clock figure, and another job on a small machine shows in it.

Targets (issue 11): calls per cycle constant and at most 5, request size constant; detection latency <= 2 s.
Targets (issue 23): <= 50 kB a cycle when nothing changed; catch-up of 7,200 blocks in <= 300 MB.
"""

import json
import os
import resource
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
ANVIL = os.environ.get("BENCH_ANVIL", "1") != "0"
CATCH_UP_BLOCKS = int(os.environ.get("BENCH_CATCH_UP_BLOCKS", "7200"))
SPAM_LOGS = 5000
SYNTHETIC_HEAD = 20_000_000
PRODUCTION_SCAN_SECONDS = 10  # PAYMENTS_SCAN_SECONDS' production default (portal/settings.py)
BLOCK_SECONDS = 12  # Ethereum


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
                contact_confirmed=True,  # a researcher with a confirmed address: the booking desk's share aside
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
    created = 1
    ether = chain.asset("ETH")

    def grow_to(target: int) -> None:
        nonlocal created
        while created < target:
            invoices.invoice_create(order=anchor, fiat_amount=Decimal("10.00"), asset=ether if created % 2 else None)
            created += 1

    realistic_blocks(processes, env, grow_to)
    if not ANVIL:
        return
    print(
        f"{'open invoices':>14} {'RPC calls/cycle':>16} {'bytes/cycle':>12} {'largest request':>16} "
        f"{'cycle ms (median)':>18} {'logs':>6} {'settled':>8} {'balances read':>14}"
    )
    for target in LEVELS:
        grow_to(target)
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


def realistic_blocks(processes: list, env: dict, grow_to) -> None:
    """Part 2: the made-up chain of realistic blocks, scanned with the same chain id, assets and invoices."""
    import urllib.request

    from django.conf import settings
    from django.core.cache import cache
    from django.utils import timezone

    from payments import balances
    from payments.models import ChainCursor, Invoice
    from payments.scanner import chain_scan

    folder = Path(tempfile.mkdtemp())
    port_file = folder / "port"
    processes.append(
        subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "synthetic_node.py"), str(port_file), "31337", str(SYNTHETIC_HEAD)],
            start_new_session=True,
        )
    )
    while not port_file.exists() or not port_file.read_text():
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port_file.read_text()}"
    synthetic_file = folder / "synthetic.toml"
    text = (ROOT / "payments" / "chains.demo.toml").read_text()
    text = text.replace('rpc_urls = ["${DEMO_RPC_URL:-http://127.0.0.1:8545}"]', f'rpc_urls = ["{url}"]')
    synthetic_file.write_text(text.replace("confirmations = 3", "confirmations = 12"))
    confirmations = 12

    def control(method: str, *params) -> object:
        request = urllib.request.Request(
            url,
            data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["result"]

    def start_at(head: int, confirmed: int) -> None:
        control("bench_setHead", head)
        ChainCursor.objects.update_or_create(
            chain_id=31337, defaults={"confirmed_block": confirmed, "head_block": 0, "scan_lease_until": None}
        )
        cache.delete("chain-scan-blocks:31337")

    # The catch-up, in a process of its own: its peak memory is the scan's (and Django's), nothing else.
    head = SYNTHETIC_HEAD
    start_at(head, head - confirmations + 1 - CATCH_UP_BLOCKS)
    control("bench_reset")
    child = subprocess.run(
        [sys.executable, __file__, "--catch-up"],
        cwd=ROOT,
        env={**env, "PAYMENTS_CHAINS_FILE": str(synthetic_file)},
        capture_output=True,
        text=True,
        check=True,
    )
    caught = json.loads(child.stdout.strip().splitlines()[-1])
    counts = control("bench_counts")
    print(f"realistic blocks ({url}, 150 transactions a block, {confirmations} confirmations)")
    print(
        f"catch-up of {caught['blocks']:,} blocks: {caught['seconds']:.1f} s, {counts['requests']} round trips "
        f"({sum(counts['calls'].values()):,} calls), {counts['bytes_out'] / 1e6:.0f} MB received, "
        f"peak memory {caught['peak_mb']:.0f} MB (Django alone {caught['base_mb']:.0f} MB; target <= 300 MB)"
    )

    anvil_file = settings.PAYMENTS_CHAINS_FILE

    def cycle() -> tuple[int, int, float]:
        settings.PAYMENTS_CHAINS_FILE = str(synthetic_file)
        try:
            control("bench_reset")
            started = time.perf_counter()
            chain_scan(chain_id=31337)
            elapsed = (time.perf_counter() - started) * 1000
            counts = control("bench_counts")
        finally:
            settings.PAYMENTS_CHAINS_FILE = anvil_file
        return counts["bytes_in"] + counts["bytes_out"], counts["requests"], elapsed

    print()
    print(
        f"{'open invoices':>14} {'nothing new':>22} {'one new block':>22} {'all re-read in full':>22} "
        f"{'3-block reorg':>22} {'token balance sweep':>22} {'MB a day at 10 s':>17}"
    )
    for target in LEVELS[:2]:
        grow_to(target)
        head += 1
        control("bench_setHead", head)
        cache.delete("chain-scan-blocks:31337")  # as after new invoices: every block not final is read in full once
        fresh = cycle()
        idle = [cycle() for _ in range(3)]
        moving = []
        for _ in range(3):
            head += 1
            control("bench_setHead", head)
            moving.append(cycle())
        control("bench_reorg", head - 2)
        reorg = cycle()
        # A cycle of the token balance sweep (every open token invoice read every 30 minutes, at most
        # TOKEN_SWEEPS_PER_CYCLE a cycle): made due at once by dating the quotes 31 minutes back.
        tokens = Invoice.objects.exclude(asset_contract="").filter(status__in=balances.OPEN)
        token_open = tokens.count()
        tokens.update(
            created_at=timezone.now() - balances.TOKEN_SWEEP_AFTER - timedelta(minutes=1), native_checked_at=None
        )
        sweep = cycle()
        idle_bytes = statistics.median(run[0] for run in idle)
        moving_bytes = statistics.median(run[0] for run in moving)
        per_day = 86400 / PRODUCTION_SCAN_SECONDS
        new_blocks = 86400 / BLOCK_SECONDS
        sweeps = token_open * (86400 / balances.TOKEN_SWEEP_AFTER.total_seconds()) / balances.TOKEN_SWEEPS_PER_CYCLE
        daily = (
            new_blocks * moving_bytes + (per_day - new_blocks) * idle_bytes + sweeps * max(0, sweep[0] - idle_bytes)
        ) / 1e6

        def shown(bytes_: float, requests: int, ms: float) -> str:
            return f"{bytes_ / 1000:.1f} kB/{requests} rt/{ms:.0f} ms"

        print(
            f"{target:>14} {shown(idle_bytes, idle[1][1], statistics.median(run[2] for run in idle)):>22} "
            f"{shown(moving_bytes, moving[1][1], statistics.median(run[2] for run in moving)):>22} "
            f"{shown(*fresh):>22} {shown(*reorg):>22} {shown(*sweep):>22} {daily:>17.0f}"
        )
    print(
        f"(nothing new: target <= 50 kB; a day at the production scan period: {86400 // PRODUCTION_SCAN_SECONDS} "
        f"cycles, {86400 // BLOCK_SECONDS} of them with a new block; 'all re-read in full' is a cycle after new "
        "invoices, and what every cycle cost before issue 23; 'token balance sweep' reads at most "
        f"{balances.TOKEN_SWEEPS_PER_CYCLE} open token invoices' balances, each every "
        f"{balances.TOKEN_SWEEP_AFTER.seconds // 60} minutes, counted in the day)"
    )
    print()
    # Back to anvil: its cursor starts again from its own head.
    ChainCursor.objects.filter(chain_id=31337).delete()
    cache.delete("chain-scan-blocks:31337")


def catch_up() -> None:
    """The catch-up of part 2, in this process alone: prints one JSON line."""
    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    django.setup()

    from payments.models import ChainCursor
    from payments.scanner import chain_scan

    base_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    before = ChainCursor.objects.get(chain_id=31337).confirmed_block
    started = time.perf_counter()
    result = chain_scan(chain_id=31337)
    seconds = time.perf_counter() - started
    after = ChainCursor.objects.get(chain_id=31337).confirmed_block
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {"blocks": after - before, "seconds": seconds, "peak_mb": peak_mb, "base_mb": base_mb, "head": result.head}
        )
    )


if __name__ == "__main__":
    if "SECRET_KEY" not in os.environ:
        os.environ["SECRET_KEY"] = secrets.token_urlsafe(64)
    if sys.argv[1:] == ["--catch-up"]:
        catch_up()
    else:
        main()
