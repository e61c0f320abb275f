"""Serve Binôme with gunicorn against PostgreSQL and measure with wrk, side by side in one run, the requests per
second and latency of the booking page (and its live quote, an order page and that page's status poll) against a
trivial view (/livez) of the same server.

    make bench                      # or: .venv/bin/python bench/pages.py --seconds 5 --rounds 3 --lots 1000

Targets (issue 10, under wrk): booking page >= 0.5x and status poll >= 0.8x the trivial view, each printed PASS or
FAIL. wrk drives the load (bench/httpload.py says why not Python); the poll is sent as htmx sends it, with the
order page's cookies, following the block's own `?v=` address. Rounds alternate between endpoints so that noise
on a shared machine hits all of them alike. Also prints the SQL query count of each page, with the fleet's size.
Needs PostgreSQL on 127.0.0.1 (BENCH_DATABASE_URL), Redis (BENCH_REDIS_URL) for the cache, and wrk.
"""

import argparse
import http.client
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from httpload import (
    BOOKING_PAGE,
    STATUS_POLL,
    TRIVIAL,
    Endpoint,
    alternating_rounds,
    check_targets,
    htmx_status_poll,
    poll_answers,
    require_wrk,
    warm_up,
)

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
        "ALLOWED_HOSTS": "127.0.0.1,testserver,book.example.org",
        "SECURE_SSL_REDIRECT": "0",
        # Production refuses a loopback SITE_URL and console mail: the public address a deployment would give (no
        # link is followed here), and a mail server that no bench sends to.
        "SITE_URL": "https://book.example.org",
        "EMAIL_URL": "smtp://127.0.0.1:9",
        "DEFAULT_FROM_EMAIL": "Binôme <bookings@book.example.org>",
        "STATIC_ROOT": static_root,
        "RATELIMIT_ENABLE": "0",
        # Production refuses the demo key (payments.E006): a public BIP-32 test vector (depth 3) stands in.
        "PAYMENTS_XPUB": (
            "xpub6D4BDPcP2GT577Vvch3R8wDkScZWzQzMMUm3PWbmWvVJrZwQY4VUNgqFJPMM3No2dFDFGTsxxpG5uJh7n7epu4trkrX7x7"
            "DogT5Uv6fcLW5"
        ),
        # Production refuses the demo chain and its tokens (payments.E001): a chain of their own, paid in a pegged
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
    return json.loads(run([PYTHON, "-c", seed, *seed_args], seed_env(env)).strip().splitlines()[-1])


def seed_env(env: dict) -> dict:
    """The environment of a script run against the bench's database (Django set up from the portal's settings)."""
    return {**env, "DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(ROOT)}


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
from inventory.models import HardwareClass, Lot
from booking import selectors
from booking.models import BookingPolicy
from tests.factories import RESEARCH_ANSWERS, add_lots, make_ssh_key

from booking.terms import terms_current

seed_demo_catalog()
add_lots(HardwareClass.objects.get(slug="h200-pair"), int(sys.argv[1]))
start = selectors.earliest_start_date(policy=BookingPolicy.current()).isoformat()
client = Client(SERVER_NAME="testserver", REMOTE_ADDR="127.0.0.9")
response = client.post("/", {
    "hardware_class": "b200-pair", "environment": "pytorch-2-7-cuda-12-8", "lots": "2", "start_date": start,
    "days": "7", "contact_name": "Bench", "contact_email": "bench@example.org", "organisation": "Bench",
    "ssh_keys": make_ssh_key(), **RESEARCH_ANSWERS,
    "accept_terms": "on", "terms_version": str(terms_current().pk),
})
assert response.status_code == 302, response.content[:500]
order_url = response["Location"]
quote_url = f"/?hardware_class=h200-pair&environment=pytorch-2-7-cuda-12-8&lots=1&days=7&start_date={start}"
counts = {}
for name, url, headers in [("booking page", "/", {}), ("live quote (htmx)", quote_url, {"HX-Request": "true"}),
                           ("order page", order_url, {}), ("order status poll (htmx)", order_url,
                           {"HX-Request": "true"}), ("trivial view /livez", "/livez", {}),
                           ("booking page, drawn", "/?drawn=1", {}),
                           ("status block, drawn", order_url, {"HX-Request": "true"})]:
    measured = []
    for _ in range(2):  # the first request may fill the page cache, the second may come from it
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url, headers=headers).status_code == 200, url
        measured.append(len(queries))
    counts[name] = "/".join(map(str, measured))
print(json.dumps({"order_url": order_url, "quote_url": quote_url, "lots": Lot.objects.count(), "queries": counts}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=4, help="length of one measuring round (whole seconds)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per endpoint, alternating")
    parser.add_argument("--concurrency", type=int, default=4, help="connections wrk keeps busy")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads (one keeps up with gunicorn here)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--lots", type=int, default=1000, help="extra lots added to the demo fleet")
    parser.add_argument("--port", type=int, default=8765)
    options = parser.parse_args()
    require_wrk()

    database_url = os.environ.get("BENCH_DATABASE_URL", "postgres://root@127.0.0.1:5432/binome_bench")
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/8")
    static_root = tempfile.mkdtemp(prefix="binome-bench-static-")
    env = bench_environment(database_url, redis_url, static_root)

    print(f"database {database_url}, cache {redis_url}; preparing ...", flush=True)
    seeded = prepare(database_url, env, SEED, str(options.lots))
    server = start_gunicorn(options.port, options.workers, env)
    try:
        endpoints = [
            Endpoint(TRIVIAL, "/livez"),
            Endpoint(BOOKING_PAGE, "/"),
            Endpoint("live quote (htmx)", seeded["quote_url"], {"HX-Request": "true"}),
            Endpoint("order page", seeded["order_url"]),
            htmx_status_poll(options.port, seeded["order_url"]),
            # What the two caching layers buy, side by side: the booking page drawn for every request (a query
            # parameter that is not the quote's keeps it out of the page cache), and the status block drawn for
            # every poll (no `?v=`: no "unchanged" answer from the middleware).
            Endpoint("booking page, drawn", "/?drawn=1"),
            Endpoint("status block, drawn", seeded["order_url"], {"HX-Request": "true"}),
        ]
        warm_up(options.port, endpoints)
        tallies = alternating_rounds(
            options.port,
            endpoints,
            rounds=options.rounds,
            seconds=options.seconds,
            connections=options.concurrency,
            threads=options.threads,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)

    trivial_rps = tallies[TRIVIAL].requests_per_second
    print()
    print(
        f"gunicorn {options.workers} sync workers; wrk, {options.concurrency} connections on {options.threads} "
        f"thread(s), {options.rounds} x {options.seconds} s per endpoint; {seeded['lots']} lots in the fleet"
    )
    header = ("endpoint", "req/s", "x trivial", "p50 ms", "p99 ms", "errors", "queries 1st/2nd")
    print("{:28} {:>8} {:>10} {:>8} {:>8} {:>7} {:>16}".format(*header))
    for name, tally in tallies.items():
        rps = tally.requests_per_second
        print(
            f"{name:28} {rps:8.1f} {rps / trivial_rps:10.2f} {tally.percentile_ms(50):8.1f} "
            f"{tally.percentile_ms(99):8.1f} {tally.error_count:7d} {seeded['queries'][name]:>16}"
        )
    print()
    print(f"status poll, following the block's own address as htmx does: {poll_answers(tallies[STATUS_POLL])}")
    for verdict in check_targets(tallies):
        print(verdict)
    for cached, drawn in ((BOOKING_PAGE, "booking page, drawn"), (STATUS_POLL, "status block, drawn")):
        gain = tallies[cached].requests_per_second / tallies[drawn].requests_per_second
        print(f"{cached}: {gain:.1f}x the requests per second of the same answer drawn every time")


if __name__ == "__main__":
    main()
