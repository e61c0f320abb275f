"""Load on gunicorn over loopback, bounded in time: the booking page and the order-status poll at rising
concurrency beside a trivial view of the same server (same run, alternating rounds), driven by wrk; then 100
researchers booking the last free lot at once through HTTP, and 100 booking B200 lots to start as soon as ready
(there are 5 free: 5 orders, 95 sold out, and no two live allocations of one lot overlapping, read in the database).

    .venv/bin/python bench/load.py [--seconds 2] [--rounds 3] [--levels 2,8,32]

Targets (issue 10, under wrk): booking page >= 0.5x and status poll >= 0.8x the trivial view at every level, each
printed PASS or FAIL; exactly one order for the last lot, every other answer "sold out", 0 errors, p99 under 1 s.
Needs PostgreSQL and Redis on 127.0.0.1 (BENCH_DATABASE_URL, default database binome_load, and BENCH_REDIS_URL,
default db 5: the database is dropped and created again), and wrk.

The steady load is wrk's (bench/httpload.py says why not Python threads). The race stays in Python on purpose: it
is one burst of 100 POSTs, each with its own CSRF cookie and token taken from its own visit of the page, released
together by a barrier and timed one by one. wrk runs for a duration and sends the next request on a connection as
soon as the last one is answered, so it would need a Lua script that hands out bodies by connection and stops each
connection after one request, and its latency figures would mix the burst with what follows. At 100 requests the
client is nowhere near saturation: what the race measures is the server's locking, not the client.
"""

import argparse
import http.client
import json
import os
import re
import secrets
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from httpload import (
    BOOKING_PAGE,
    STATUS_POLL,
    TRIVIAL,
    Endpoint,
    Tally,
    alternating_rounds,
    check_targets,
    htmx_status_poll,
    poll_answers,
    require_wrk,
    warm_up,
)
from pages import PYTHON, bench_environment, prepare, run, seed_env, start_gunicorn

SEED = """
import django, json
django.setup()
from django.test import Client
from provisioning.demo import seed_demo_catalog
from booking.models import BookingPolicy
from booking.selectors import earliest_start_date
from tests.factories import RESEARCH_ANSWERS, make_ssh_key

from booking.terms import terms_current

seed_demo_catalog()
# The race is for the last lot, by 100 strangers: the share of a class held by unconfirmed addresses is opened whole
BookingPolicy.objects.filter(pk=1).update(unconfirmed_share_percent=100)
start = earliest_start_date(policy=BookingPolicy.current()).isoformat()
client = Client(SERVER_NAME="testserver")
response = client.post("/", {
    "hardware_class": "b200-pair", "environment": "pytorch-2-7-cuda-12-8", "lots": "1", "start_date": start,
    "days": "7", "contact_name": "Load", "contact_email": "load@example.org", "organisation": "Bench",
    "billing_address": "1 rue du Banc, Paris", "billing_country": "FR", "ssh_keys": make_ssh_key(), **RESEARCH_ANSWERS,
    "accept_terms": "on", "terms_version": str(terms_current().pk),
})
assert response.status_code == 302, response.content.decode()[-3000:]
print(json.dumps({"order_url": response["Location"], "start": start, "key": make_ssh_key()}))
"""


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(fraction * len(values)))]


def booking_race(port: int, start: str, key: str, racers: int = 100, *, when_ready: bool = False) -> dict:
    """`racers` clients load the page (cookie + token), then post the last MI300X lot at the same moment; with
    `when_ready`, one B200 lot each, to start as soon as ready."""
    barrier = threading.Barrier(racers)
    results: list[tuple[int, str, float]] = []
    lock = threading.Lock()

    def racer(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/", headers={"Host": "127.0.0.1"})
        response = connection.getresponse()
        page = response.read().decode()
        cookie = response.getheader("Set-Cookie", "").split(";")[0]
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        body = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": token,
                "hardware_class": "b200-pair" if when_ready else "mi300x-pair",
                "environment": "pytorch-2-7-cuda-12-8" if when_ready else "pytorch-2-6-rocm-6-4",
                "lots": "1",
                "start_date": start,
                **({"start_when_ready": "on"} if when_ready else {}),
                "days": "7",
                "contact_name": f"Racer {index}",
                "contact_email": f"racer{index}@example.org",
                "organisation": "Bench",
                "billing_address": "1 rue du Banc, Paris",
                "billing_country": "FR",
                "ssh_keys": key,
                "sharing": "full_copy",
                "hypothesis": "shorter_step",
                "hypothesis_detail": "Two cards halve the step at the same global batch.",
                "hypothesis_measure": "Median step time after warm-up, one card then two.",
                "accept_terms": "on",
                "terms_version": re.search(r'name="terms_version" value="(\d+)"', page).group(1),
            }
        )
        connection.close()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        barrier.wait(timeout=60)
        started = time.perf_counter()
        connection.request(
            "POST",
            "/",
            body=body,
            headers={
                "Host": "127.0.0.1",
                "Cookie": cookie,
                "Content-Type": "application/x-www-form-urlencoded",
                "Referer": f"http://127.0.0.1:{port}/",
            },
        )
        answer = connection.getresponse()
        text = answer.read().decode()
        elapsed = time.perf_counter() - started
        with lock:
            results.append((answer.status, text, elapsed))

    threads = [threading.Thread(target=racer, args=(index,)) for index in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    latencies = sorted(elapsed for _status, _text, elapsed in results)
    return {
        "orders": sum(status == 302 for status, _text, _elapsed in results),
        "sold_out": sum(status == 200 and "Sold out" in text for status, text, _elapsed in results),
        "errors": sum(status >= 500 for status, _text, _elapsed in results),
        "answers": len(results),
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
    }


OVERLAPS = """
import django, json
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute(
        "SELECT count(*) FROM booking_allocation a JOIN booking_allocation b ON a.lot_id = b.lot_id AND a.id < b.id "
        "WHERE a.released_at IS NULL AND b.released_at IS NULL AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at"
    )
    overlaps = cursor.fetchone()[0]
from booking.models import Order
print(json.dumps({"overlaps": overlaps, "when_ready": Order.objects.filter(start_when_ready=True).count()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=2, help="length of one measuring round (whole seconds)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per endpoint and level, alternating")
    parser.add_argument("--levels", default="2,8,32", help="connections wrk keeps busy, one level after another")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads (one keeps up with gunicorn here)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=8766)
    options = parser.parse_args()
    require_wrk()
    database_url = os.environ.get("BENCH_DATABASE_URL", "postgres://root@127.0.0.1:5432/binome_load")
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")
    env = bench_environment(database_url, redis_url, tempfile.mkdtemp(prefix="binome-load-"))
    env["SECRET_KEY"] = secrets.token_urlsafe(64)
    seeded = prepare(database_url, env, SEED)
    server = start_gunicorn(options.port, options.workers, env)
    try:
        endpoints = [
            Endpoint(TRIVIAL, "/livez"),
            Endpoint(BOOKING_PAGE, "/"),
            htmx_status_poll(options.port, seeded["order_url"]),
        ]
        warm_up(options.port, endpoints)
        print(
            f"gunicorn {options.workers} sync workers; wrk on {options.threads} thread(s), "
            f"{options.rounds} x {options.seconds} s per endpoint and level"
        )
        print(f"{'conns':>6} {'endpoint':28} {'req/s':>8} {'x trivial':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
        verdicts = []
        polls = Tally()
        for level in (int(value) for value in options.levels.split(",")):
            tallies = alternating_rounds(
                options.port,
                endpoints,
                rounds=options.rounds,
                seconds=options.seconds,
                connections=level,
                threads=options.threads,
            )
            polls.merge(tallies[STATUS_POLL])
            trivial = tallies[TRIVIAL].requests_per_second
            for name, tally in tallies.items():
                rps = tally.requests_per_second
                print(
                    f"{level:>6} {name:28} {rps:8.1f} {rps / trivial:10.2f} {tally.percentile_ms(50):8.1f} "
                    f"{tally.percentile_ms(99):8.1f} {tally.error_count:7d}"
                )
            verdicts += [f"{verdict} at {level} connections" for verdict in check_targets(tallies)]
        print()
        print(f"status poll, following the block's own address as htmx does: {poll_answers(polls)}")
        for verdict in verdicts:
            print(verdict)
        race = booking_race(options.port, seeded["start"], seeded["key"])
        print()
        print(
            f"100 bookings of the last lot: {race['orders']} order, {race['sold_out']} sold out, "
            f"{race['errors']} errors of {race['answers']} answers; p50 {race['p50'] * 1000:.0f} ms, "
            f"p99 {race['p99'] * 1000:.0f} ms"
        )
        race_passed = race["orders"] == 1 and race["errors"] == 0 and race["answers"] == 100 and race["p99"] < 1
        print(f"{'PASS' if race_passed else 'FAIL'}  the race: exactly 1 order, 0 errors, p99 < 1 s")
        ready = booking_race(options.port, seeded["start"], seeded["key"], when_ready=True)
        found = json.loads(run([PYTHON, "-c", OVERLAPS], seed_env(env)).strip().splitlines()[-1])
        print(
            f"100 bookings of B200 lots as soon as ready (5 free): {ready['orders']} orders, {ready['sold_out']} "
            f"sold out, {ready['errors']} errors of {ready['answers']} answers; p50 {ready['p50'] * 1000:.0f} ms, "
            f"p99 {ready['p99'] * 1000:.0f} ms; {found['when_ready']} such orders in the database, "
            f"{found['overlaps']} overlapping live allocations"
        )
        ready_passed = (
            ready["orders"] == 5 == found["when_ready"]
            and found["overlaps"] == 0
            and ready["errors"] == 0
            and ready["answers"] == 100
        )
        print(f"{'PASS' if ready_passed else 'FAIL'}  as soon as ready: exactly 5 orders, 0 overlaps, 0 errors")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
