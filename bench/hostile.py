"""A hostile-input run against gunicorn (issue 13): the attacks of the issue and large bodies on every form,
from several clients at once. Prints requests sent, the slowest answer and the count of server errors (target 0).

Then the limits strangers could turn against a researcher (issue 19), each from its own loopback address
(127.0.0.x: the portal counts REMOTE_ADDR): a stranger holding the unpaid-lots limit under a victim's e-mail
address (the victim must still book), one client booking three classes at the same instant with a limit of one
lot (one order must pass), and eight parallel presses of "revoke my links" (one revocation, one e-mail).

    .venv/bin/python bench/hostile.py --rounds 20

Serves `bin/web` (development settings, a throwaway SQLite database seeded with the demo catalog) on a free port
of 127.0.0.1, and stops it at the end.
"""

import argparse
import concurrent.futures
import http.client
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import date, timedelta
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
BODY_LIMIT = 352 * 1024


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Client:
    def __init__(self, port: int, source: str = "127.0.0.1") -> None:
        self.port = port
        self.source = source
        self.cookies: dict[str, str] = {}
        self.location = ""

    def request(self, method: str, path: str, body: bytes = b"", content_type: str = "") -> tuple[int, bytes, float]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120, source_address=(self.source, 0))
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}
        if content_type:
            headers["Content-Type"] = content_type
        started = time.perf_counter()
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        content = response.read()
        elapsed = time.perf_counter() - started
        self.location = response.getheader("Location") or ""
        for header in response.msg.get_all("Set-Cookie") or []:
            name, _, rest = header.partition("=")
            self.cookies[name] = rest.split(";", 1)[0]
        connection.close()
        return response.status, content, elapsed

    def csrf(self) -> str:
        _status, content, _elapsed = self.request("GET", "/")
        return re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', content).group(1).decode()


def booking(csrf: str, **overrides: str) -> bytes:
    data = {
        "csrfmiddlewaretoken": csrf,
        "hardware_class": "b200-pair",
        "environment": "pytorch-2-7-cuda-12-8",
        "lots": "1",
        "start_date": "2099-01-01",
        "days": "7",
        "contact_name": "Ada Lovelace",
        "contact_email": "ada@example.org",
        "organisation": "Lab",
        "ssh_keys": "ssh-ed25519 AAAA",
        "sharing": "full_copy",
        "hypothesis": "bigger_batch",
        "hypothesis_detail": "A bigger global batch reaches the target loss sooner.",
        "hypothesis_measure": "Loss against examples seen.",
        "notes": "",
        **overrides,
    }
    return urlencode(data).encode()


def attacks(csrf: str) -> list[tuple[str, str, str, bytes, str]]:
    form = "application/x-www-form-urlencoded"
    boundary = uuid.uuid4().hex
    upload = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="csrfmiddlewaretoken"\r\n\r\n{csrf}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="report"; filename="r.json"\r\n\r\n'
        ).encode()
        + b"[" * 3_000_000
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return [
        ("notes: '<', 80,000 spaces, '1'", "POST", "/", booking(csrf, notes="<" + " " * 80_000 + "1"), form),
        (
            "notes: '<' and spaces up to the body limit",
            "POST",
            "/",
            booking(csrf, notes="<" + " " * 350_000 + "1"),
            form,
        ),
        (
            "every text field huge",
            "POST",
            "/",
            booking(csrf, **{n: "< " * 15_000 for n in ("contact_name", "organisation", "notes", "hypothesis_detail")}),
            form,
        ),
        ("ssh_keys: 'ssh-ed25519 ' repeated", "POST", "/", booking(csrf, ssh_keys="ssh-ed25519 " * 25_000), form),
        ("a 3 MB body", "POST", "/", booking(csrf, notes="n" * 3_000_000), form),
        ("quote with huge values", "POST", "/", booking(csrf, action="quote", lots="9" * 300_000), form),
        (
            "resend: huge address",
            "POST",
            "/orders/resend-link/",
            urlencode({"csrfmiddlewaretoken": csrf, "email": "a@" + "b." * 150_000 + "org"}).encode(),
            form,
        ),
        (
            "sign-in: huge username",
            "POST",
            "/admin/login/",
            urlencode({"csrfmiddlewaretoken": csrf, "username": "<" * 100_000, "password": "x"}).encode(),
            form,
        ),
        (
            "a 3 MB upload to an order",
            "POST",
            "/orders/BN-AAAAAAAA/" + "t" * 43 + "/split-trial/",
            upload,
            f"multipart/form-data; boundary={boundary}",
        ),
    ]


def manage(env: dict, code: str) -> str:
    """Run Python in the portal's context (the run's own SQLite database) and return what it printed."""
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", code],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def real_booking(client: Client, *, later_days: int = 0, **overrides: str) -> bytes:
    """A booking the portal accepts: the form's own terms version and earliest start date (or so many days
    later), a real SSH key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    _status, page, _elapsed = client.request("GET", "/")
    csrf = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
    terms = re.search(rb'name="terms_version" value="([^"]+)"', page).group(1).decode()
    start = re.search(rb'name="start_date" value="([^"]+)"', page).group(1).decode()
    start = (date.fromisoformat(start) + timedelta(days=later_days)).isoformat()
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    line = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return booking(
        csrf,
        start_date=start,
        ssh_keys=f"{line} bench@hostile",
        accept_terms="on",
        terms_version=terms,
        **overrides,
    )


def cap_abuse(port: int, env: dict) -> list[str]:
    """The cap abuse cases; returns the failures (empty: every limit held)."""
    form = "application/x-www-form-urlencoded"
    failures = []
    manage(
        env,
        "from booking.models import BookingPolicy as P; p = P.current(); p.max_unpaid_lots_per_client = 2; p.save()",
    )

    # 1. A stranger takes the limit under the victim's address; the victim books from their own connection.
    stranger, victim = Client(port, "127.0.0.2"), Client(port, "127.0.0.3")
    taken, _b, _e = stranger.request(
        "POST", "/", real_booking(stranger, lots="2", contact_email="victim@lab.example"), form
    )
    booked, _b, _e = victim.request(
        "POST", "/", real_booking(victim, lots="2", contact_email="victim@lab.example"), form
    )
    print(f"victim lockout: stranger's booking {taken}, then the victim's own {booked} (302: booked)")
    if taken != 302 or booked != 302:
        failures.append("a stranger's orders under the victim's address kept the victim from booking")

    # 2. One client, three classes, one instant, a limit of one lot: one order passes, five rounds.
    manage(
        env,
        "from booking.models import BookingPolicy as P; p = P.current(); p.max_unpaid_lots_per_client = 1; p.save()",
    )
    classes = [
        ("b200-pair", "pytorch-2-7-cuda-12-8"),
        ("h200-pair", "pytorch-2-4-cuda-12-4"),
        ("mi300x-pair", "pytorch-2-6-rocm-6-4"),
    ]
    for round_ in range(5):
        source = f"127.0.1.{round_ + 1}"
        clients = [Client(port, source) for _ in classes]
        bodies = [
            real_booking(
                client,
                later_days=10 * (round_ + 1),
                hardware_class=slug,
                environment=image,
                contact_email=f"round{round_}@lab.example",
            )
            for client, (slug, image) in zip(clients, classes, strict=True)
        ]
        with concurrent.futures.ThreadPoolExecutor(len(classes)) as pool:
            statuses = list(
                pool.map(lambda pair: pair[0].request("POST", "/", pair[1], form)[0], zip(clients, bodies, strict=True))
            )
        passed = statuses.count(302)
        print(f"cross-class limit, round {round_ + 1}: answers {sorted(statuses)} ({passed} order placed, limit 1 lot)")
        if passed != 1:
            failures.append(f"cross-class limit: {passed} orders placed at once under a limit of one lot")

    # 3. Eight parallel presses of "revoke my links" on one order.
    owner = Client(port, "127.0.2.1")
    placed, _b, _e = owner.request(
        "POST", "/", real_booking(owner, later_days=90, lots="1", contact_email="revoker@lab.example"), form
    )
    order_path = owner.location
    if placed != 302:
        return [*failures, f"the order to revoke links of could not be placed ({placed})"]
    _status, page, _elapsed = owner.request("GET", order_path)
    csrf = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
    body = urlencode({"csrfmiddlewaretoken": csrf}).encode()

    def revoke(_index: int) -> int:
        own = Client(port, "127.0.2.1")
        own.cookies = dict(owner.cookies)
        return own.request("POST", order_path + "revoke-links/", body, form)[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(revoke, range(8)))
    public_id = order_path.split("/")[2]
    count = (
        "from booking.models import OrderEvent; "
        f"print(OrderEvent.objects.filter(order__public_id='{public_id}', reason='links revoked').count())"
    )
    revocations = int(manage(env, count))
    print(f"parallel revocations: answers {sorted(statuses)}, {revocations} revocation recorded (each mails one link)")
    if revocations != 1:
        failures.append(f"{revocations} revocations (and e-mails) for eight parallel presses")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20, help="times each attack is sent")
    parser.add_argument("--clients", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="binome-hostile-")
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "DEBUG": "1",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "DATABASE_URL": f"sqlite:///{directory}/db.sqlite3",
        "CELERY_BROKER_URL": f"sqla+sqlite:///{directory}/broker.sqlite3",
        "CELERY_RESULT_BACKEND": f"db+sqlite:///{directory}/results.sqlite3",
        "RATELIMIT_ENABLE": "0",
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "WEB_CONCURRENCY": str(args.workers),
        "LOG_LEVEL": "WARNING",
    }
    env.pop("REDIS_URL", None)
    for command in (["migrate", "--no-input", "-v", "0"], ["seed_demo"]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True, capture_output=True)
    log = Path(directory) / "web.log"
    with log.open("w") as output:
        web = subprocess.Popen(
            ["bash", "bin/web"], cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        client = Client(port)
        deadline = time.monotonic() + 60
        while True:
            try:
                csrf = client.csrf()
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit(log.read_text())
                time.sleep(0.3)
        plan = attacks(csrf) * args.rounds

        def send(attack):
            label, method, path, body, content_type = attack
            own = Client(port)
            own.cookies = dict(client.cookies)
            status, _content, elapsed = own.request(method, path, body, content_type)
            return label, status, elapsed

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            results = list(pool.map(send, plan))
        wall = time.perf_counter() - started
        print("limits strangers could turn against a researcher:")
        failures = cap_abuse(port, env)
        print()
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)
    by_label: dict[str, list[tuple[int, float]]] = {}
    for label, status, elapsed in results:
        by_label.setdefault(label, []).append((status, elapsed))
    for label, answers in by_label.items():
        statuses = sorted({status for status, _ in answers})
        print(f"{label:45s} statuses {statuses}  slowest {max(e for _, e in answers) * 1000:7.1f} ms")
    errors = sum(1 for _, status, _ in results if status >= 500)
    slowest = max(results, key=lambda result: result[2])
    print(
        f"\nrequests sent: {len(results)} in {wall:.1f} s by {args.clients} clients to {args.workers} gunicorn workers"
    )
    print(f"slowest answer: {slowest[2] * 1000:.1f} ms ({slowest[0]}, {slowest[1]})")
    print(f"server errors (5xx): {errors}")
    print(f"limits that did not hold: {len(failures)}" + "".join(f"\n  - {failure}" for failure in failures))
    sys.exit(1 if errors or failures else 0)


if __name__ == "__main__":
    main()
