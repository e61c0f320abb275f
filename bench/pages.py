"""Serve Binôme with gunicorn against PostgreSQL and measure, side by side in one run, the requests per second of
the booking page (and its live quote, and an order page) against a trivial view (/livez) of the same server.

    make bench                      # or: .venv/bin/python bench/pages.py --seconds 5 --rounds 3 --lots 1000

Target (issue 2): booking page >= 0.5 x the trivial view. Rounds alternate between endpoints so that noise on a
shared machine hits both alike. Also prints the SQL query count of each page, with the fleet's size.
Needs PostgreSQL on 127.0.0.1 (BENCH_DATABASE_URL) and, if available, Redis (BENCH_REDIS_URL) for the cache.
"""

import argparse
import html
import http.client
import json
import multiprocessing
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


BENCH_CHAINS = """
[[chains]]
chain_id = 8453
name = "Base"
rpc_urls = ["http://127.0.0.1:9/unused"]
confirmations = 12

  [[chains.assets]]
  symbol = "EURC"
  contract = "0x60a3E35Cc302bFA44Cb288Bc5a4F316Fdb1adb42"
  decimals = 6
  pegged_to = "EUR"
"""


def bench_chains_file(directory: str) -> str:
    path = Path(directory) / "chains.toml"
    path.write_text(BENCH_CHAINS)
    return str(path)


def bench_environment(database_url: str, redis_url: str, static_root: str) -> dict:
    return {
        **os.environ,
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "ALLOWED_HOSTS": "127.0.0.1,testserver",
        "SECURE_SSL_REDIRECT": "0",
        "STATIC_ROOT": static_root,
        "RATELIMIT_ENABLE": "0",
        # Production settings refuse the demo key: a public BIP-32 test vector (depth 3) stands in.
        "PAYMENTS_XPUB": (
            "xpub6D4BDPcP2GT577Vvch3R8wDkScZWzQzMMUm3PWbmWvVJrZwQY4VUNgqFJPMM3No2dFDFGTsxxpG5uJh7n7epu4trkrX7x7"
            "DogT5Uv6fcLW5"
        ),
        # Production settings refuse the demo chain and its tokens: a chain of their own, paid in a pegged
        # stablecoin (no RPC call is needed to quote it).
        "PAYMENTS_CHAINS_FILE": bench_chains_file(static_root),
        "LOG_LEVEL": "WARNING",
    }


def run(args: list[str], env: dict) -> str:
    result = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def recreate_database(database_url: str) -> None:
    import psycopg

    name = database_url.rsplit("/", 1)[1]
    admin_url = database_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')


def prepare(database_url: str, env: dict, seed: str, *seed_args: str) -> dict:
    """A fresh database, migrated, static files collected, seeded by `seed` (a script printing one JSON line)."""
    recreate_database(database_url)
    run([PYTHON, "manage.py", "migrate", "--no-input", "-v", "0"], env)
    run([PYTHON, "manage.py", "collectstatic", "--no-input", "-v", "0"], env)
    run([PYTHON, "manage.py", "compilemessages", "--locale", "fr", "--ignore", ".venv", "-v", "0"], env)
    seed_env = {**env, "DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(ROOT)}
    return json.loads(run([PYTHON, "-c", seed, *seed_args], seed_env).strip().splitlines()[-1])


def start_gunicorn(port: int, workers: int, env: dict) -> subprocess.Popen:
    """gunicorn on 127.0.0.1:port, returned once /livez answers."""
    server = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "gunicorn",
            "portal.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=ROOT,
    )
    for _ in range(100):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            connection.request("GET", "/livez", headers={"Host": "127.0.0.1"})
            if connection.getresponse().status == 200:
                return server
        except OSError:
            time.sleep(0.1)
    server.terminate()
    sys.exit("gunicorn did not start")


SEED = """
import django, json, sys
django.setup()
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from provisioning.demo import seed_demo_catalog
from booking.models import HardwareClass, Lot
from booking import selectors
from booking.models import BookingPolicy
from tests.factories import add_lots, make_ssh_key

seed_demo_catalog()
add_lots(HardwareClass.objects.get(slug="h200-pair"), int(sys.argv[1]))
start = selectors.earliest_start_date(policy=BookingPolicy.current()).isoformat()
client = Client(SERVER_NAME="testserver", REMOTE_ADDR="127.0.0.9")
response = client.post("/", {
    "hardware_class": "b200-pair", "environment": "pytorch-2-7-cuda-12-8", "lots": "2", "start_date": start,
    "days": "7", "contact_name": "Bench", "contact_email": "bench@example.org", "organisation": "Bench",
    "ssh_keys": make_ssh_key(), "hypothesis": "bigger_batch",
})
assert response.status_code == 302, response.content[:500]
order_url = response["Location"]
quote_url = f"/?hardware_class=h200-pair&environment=pytorch-2-7-cuda-12-8&lots=1&days=7&start_date={start}"
counts = {}
for name, url, headers in [("booking page", "/", {}), ("live quote (htmx)", quote_url, {"HX-Request": "true"}),
                           ("order page", order_url, {}), ("order status poll (htmx)", order_url,
                           {"HX-Request": "true"}), ("trivial view /livez", "/livez", {})]:
    measured = []
    for _ in range(2):  # the first request may fill the page cache, the second may come from it
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url, headers=headers).status_code == 200, url
        measured.append(len(queries))
    counts[name] = "/".join(map(str, measured))
print(json.dumps({"order_url": order_url, "quote_url": quote_url, "lots": Lot.objects.count(), "queries": counts}))
"""


POLL_URL = re.compile(rb'hx-get="([^"]+\?v=[0-9a-f]+)"')


def worker(port: int, path: str, headers: dict, seconds: float, queue) -> None:
    """Requests `path` back to back. A path with `?v=` is a status poll and follows it as htmx does: a block that
    comes back (200) is swapped in, and the poll goes on with the address that block names."""
    latencies = []
    errors = no_content = 0
    follow = "?v=" in path
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("GET", path, headers={"Host": "127.0.0.1", **headers})
            response = connection.getresponse()
            body = response.read()
            connection.close()
            if response.status not in (200, 204):  # 204: a poll whose block is unchanged
                errors += 1
                continue
        except OSError:
            errors += 1
            continue
        latencies.append(time.perf_counter() - started)
        no_content += response.status == 204
        if follow and response.status == 200 and (found := POLL_URL.search(body)):
            path = html.unescape(found.group(1).decode())
    queue.put((latencies, errors, no_content))


def measure(port: int, path: str, headers: dict, seconds: float, concurrency: int) -> dict:
    queue = multiprocessing.Queue()
    processes = [
        multiprocessing.Process(target=worker, args=(port, path, headers, seconds, queue)) for _ in range(concurrency)
    ]
    for process in processes:
        process.start()
    results = [queue.get() for _ in processes]
    for process in processes:
        process.join()
    latencies = sorted(latency for result in results for latency in result[0])
    errors = sum(result[1] for result in results)
    no_content = sum(result[2] for result in results)
    return {
        "requests": len(latencies),
        "errors": errors,
        "no_content": no_content,
        "latencies": latencies,
        "seconds": seconds,
    }


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(fraction * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="length of one measuring round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per endpoint, alternating")
    parser.add_argument("--concurrency", type=int, default=4, help="client processes")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--lots", type=int, default=1000, help="extra lots added to the demo fleet")
    parser.add_argument("--port", type=int, default=8765)
    options = parser.parse_args()

    database_url = os.environ.get("BENCH_DATABASE_URL", "postgres://root@127.0.0.1:5432/binome_bench")
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/8")
    static_root = tempfile.mkdtemp(prefix="binome-bench-static-")
    env = bench_environment(database_url, redis_url, static_root)

    print(f"database {database_url}, cache {redis_url}; preparing ...", flush=True)
    seeded = prepare(database_url, env, SEED, str(options.lots))
    server = start_gunicorn(options.port, options.workers, env)
    try:
        endpoints = {
            "trivial view /livez": ("/livez", {}),
            "booking page": ("/", {}),
            "live quote (htmx)": (seeded["quote_url"], {"HX-Request": "true"}),
            "order page": (seeded["order_url"], {}),
            "order status poll (htmx)": (seeded["order_url"], {"HX-Request": "true"}),
        }
        for path, headers in endpoints.values():  # warm-up: connections, template caches
            measure(options.port, path, headers, 0.5, 1)
        totals = {name: {"requests": 0, "errors": 0, "latencies": [], "seconds": 0.0} for name in endpoints}
        for _round in range(options.rounds):
            for name, (path, headers) in endpoints.items():
                result = measure(options.port, path, headers, options.seconds, options.concurrency)
                totals[name]["requests"] += result["requests"]
                totals[name]["errors"] += result["errors"]
                totals[name]["latencies"] += result["latencies"]
                totals[name]["seconds"] += result["seconds"]
    finally:
        server.terminate()
        server.wait(timeout=30)

    trivial_rps = totals["trivial view /livez"]["requests"] / totals["trivial view /livez"]["seconds"]
    print()
    print(
        f"gunicorn {options.workers} sync workers, {options.concurrency} client processes, "
        f"{options.rounds} x {options.seconds:g} s per endpoint, {seeded['lots']} lots in the fleet"
    )
    header = ("endpoint", "req/s", "x trivial", "p50 ms", "p99 ms", "errors", "queries 1st/2nd")
    print("{:28} {:>8} {:>10} {:>8} {:>8} {:>7} {:>16}".format(*header))
    for name, total in totals.items():
        rps = total["requests"] / total["seconds"]
        latencies = sorted(total["latencies"])
        print(
            f"{name:28} {rps:8.1f} {rps / trivial_rps:10.2f} {percentile(latencies, 0.5) * 1000:8.1f} "
            f"{percentile(latencies, 0.99) * 1000:8.1f} {total['errors']:7d} {seeded['queries'][name]:>16}"
        )
    ratio = totals["booking page"]["requests"] / totals["booking page"]["seconds"] / trivial_rps
    print()
    print(f"booking page / trivial view = {ratio:.2f} (target >= 0.5): {'met' if ratio >= 0.5 else 'NOT met'}")
    if statistics.fmean([t["errors"] for t in totals.values()]) > 0:
        print("some requests failed: see the errors column")


if __name__ == "__main__":
    main()
