"""Load on gunicorn over loopback, bounded in time: the booking page and the order-status poll at rising
concurrency beside a trivial view of the same server (same run, alternating), then 100 researchers booking the
last free lot at once through HTTP.

    .venv/bin/python bench/load.py [--seconds 2] [--rounds 3] [--levels 2,8,32]

Targets (issue 6): booking page >= 0.5x and status poll >= 0.8x the trivial view; exactly one order for the last
lot, every other answer "sold out", p99 under 1 s. Needs PostgreSQL and Redis on 127.0.0.1 (BENCH_DATABASE_URL,
default database binome_load, and BENCH_REDIS_URL, default db 5: the database is dropped and created again).
"""

import argparse
import html
import http.client
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
from pages import bench_environment, measure, percentile, prepare, start_gunicorn

SEED = """
import django, json
django.setup()
from django.test import Client
from provisioning.demo import seed_demo_catalog
from booking.models import BookingPolicy
from booking.selectors import earliest_start_date
from tests.factories import make_ssh_key

seed_demo_catalog()
start = earliest_start_date(policy=BookingPolicy.current()).isoformat()
client = Client(SERVER_NAME="testserver")
response = client.post("/", {
    "hardware_class": "b200-pair", "environment": "pytorch-2-7-cuda-12-8", "lots": "1", "start_date": start,
    "days": "7", "contact_name": "Load", "contact_email": "load@example.org", "organisation": "Bench",
    "ssh_keys": make_ssh_key(), "hypothesis": "bigger_batch",
})
print(json.dumps({"order_url": response["Location"], "start": start, "key": make_ssh_key()}))
"""


def browser_cookie(port: int, path: str) -> str:
    """The cookies a browser holds after opening `path` (the order page sets the CSRF cookie)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path, headers={"Host": "127.0.0.1"})
    response = connection.getresponse()
    response.read()
    cookies = [header.split(";")[0] for name, header in response.getheaders() if name.lower() == "set-cookie"]
    connection.close()
    return "; ".join(cookies)


def polled_url(port: int, path: str, headers: dict) -> str:
    """The URL in the status block's hx-get: what htmx polls once the block is on the page."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path, headers={"Host": "127.0.0.1", **headers})
    block = connection.getresponse().read().decode()
    connection.close()
    return html.unescape(re.search(r'hx-get="([^"]+)"', block).group(1))


def booking_race(port: int, start: str, key: str, racers: int = 100) -> dict:
    """`racers` clients load the page (cookie + token), then post the last MI300X lot at the same moment."""
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
                "hardware_class": "mi300x-pair",
                "environment": "pytorch-2-6-rocm-6-4",
                "lots": "1",
                "start_date": start,
                "days": "7",
                "contact_name": f"Racer {index}",
                "contact_email": f"racer{index}@example.org",
                "organisation": "Bench",
                "ssh_keys": key,
                "hypothesis": "shorter_step",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one measuring round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per endpoint and level, alternating")
    parser.add_argument("--levels", default="2,8,32", help="client processes per measurement")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=8766)
    options = parser.parse_args()
    database_url = os.environ.get("BENCH_DATABASE_URL", "postgres://root@127.0.0.1:5432/binome_load")
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")
    env = bench_environment(database_url, redis_url, tempfile.mkdtemp(prefix="binome-load-"))
    env["SECRET_KEY"] = secrets.token_urlsafe(64)
    seeded = prepare(database_url, env, SEED)
    server = start_gunicorn(options.port, options.workers, env)
    try:
        # The poll as an open order page sends it: with the cookies the page set, to the URL the block names.
        poll_headers = {"HX-Request": "true", "Cookie": browser_cookie(options.port, seeded["order_url"])}
        poll_url = polled_url(options.port, seeded["order_url"], poll_headers)
        endpoints = {
            "trivial view /livez": ("/livez", {}),
            "booking page": ("/", {}),
            "order status poll (htmx)": (poll_url, poll_headers),
        }
        print(f"{'clients':>8} {'endpoint':28} {'req/s':>8} {'x trivial':>10} {'p50 ms':>8} {'p99 ms':>8}")
        errors = 0
        no_content = dict.fromkeys(endpoints, 0)
        total = dict.fromkeys(endpoints, 0)
        for level in (int(value) for value in options.levels.split(",")):
            # Rounds alternate between the endpoints, so a slow patch of this shared machine falls on each of them.
            counts = dict.fromkeys(endpoints, 0)
            latencies_by = {name: [] for name in endpoints}
            for _round in range(options.rounds):
                for name, (path, headers) in endpoints.items():
                    result = measure(options.port, path, headers, options.seconds, level)
                    counts[name] += result["requests"]
                    latencies_by[name] += result["latencies"]
                    errors += result["errors"]
                    no_content[name] += result["no_content"]
            figures = {
                name: (counts[name] / (options.seconds * options.rounds), sorted(latencies_by[name]))
                for name in endpoints
            }
            for name in endpoints:
                total[name] += counts[name]
            trivial = figures["trivial view /livez"][0]
            for name, (rps, latencies) in figures.items():
                print(
                    f"{level:>8} {name:28} {rps:8.1f} {rps / trivial:10.2f} "
                    f"{percentile(latencies, 0.5) * 1000:8.1f} {percentile(latencies, 0.99) * 1000:8.1f}"
                )
        poll = "order status poll (htmx)"
        print(
            f"\n{errors} errors in all; the poll, following the block's own address as htmx does, got "
            f"{no_content[poll]} '204 unchanged' and {total[poll] - no_content[poll]} blocks of {total[poll]} answers"
        )
        race = booking_race(options.port, seeded["start"], seeded["key"])
        print()
        print(
            f"100 bookings of the last lot: {race['orders']} order, {race['sold_out']} sold out, "
            f"{race['errors']} errors of {race['answers']} answers; p50 {race['p50'] * 1000:.0f} ms, "
            f"p99 {race['p99'] * 1000:.0f} ms (target: 1 order, p99 < 1 s)"
        )
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
