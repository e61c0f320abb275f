"""`make run`'s embedded default behaves like production: web (gunicorn, two workers), a Celery worker and beat, on
SQLite and the server-free broker and without Redis, share one cache. What the worker or beat changes shows on the
order page's next poll and on the next booking page load, as it does with Redis.

The processes are started as the Procfile starts them (`bin/web`, `bin/worker`, `bin/beat`, the demo chain set up
as `bin/chain` does), on files in a temporary folder, with REDIS_URL empty.
"""

import html
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import closing
from dataclasses import dataclass, field
from datetime import date, timedelta
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

from payments import config
from payments.chain_demo import DevChain
from provisioning.demo import DEMO_OPERATOR_PASSWORD, DEMO_OPERATOR_USERNAME
from tests.browser.steps import pay_link
from tests.factories import RESEARCH_ANSWERS, make_ssh_key
from tests.payments.conftest import Anvil, chains_toml, free_port
from tests.processes import stop_process_groups

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 120.0  # a status the worker or beat never reaches: only a real hang waits this long
POLL_EVERY_S = 0.5  # htmx polls every 5 s; the test polls faster, so that a stale answer has many chances to show
STALE_POLLS = 1  # polls after the commit still showing the old status: the instant before the version is replaced
ORDER_PATH = re.compile(r"/orders/BN-[0-9A-Z]+/[^/]+/")
B200 = {"hardware_class": "b200-pair", "environment": "pytorch-2-7-cuda-12-8"}
MI300X = {"hardware_class": "mi300x-pair", "environment": "pytorch-2-6-rocm-6-4"}  # one lot in the demo fleet


@dataclass
class Answer:
    status: int
    body: str
    url: str


class Visitor:
    """A browser without JavaScript: cookies, forms with their CSRF token; `htmx=True` adds htmx's header."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))

    def get(self, path: str, *, htmx: bool = False) -> Answer:
        return self._send(urllib.request.Request(self.base_url + path, headers={"HX-Request": "true"} if htmx else {}))

    def post(self, path: str, data: dict, *, form_page: str | None = None) -> Answer:
        """Post `data` with the CSRF token of the form on `form_page` (default: `path`), as a browser would."""
        page = self.get(form_page or path).body
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        body = urllib.parse.urlencode({**data, "csrfmiddlewaretoken": token}).encode()
        return self._send(urllib.request.Request(self.base_url + path, data=body))

    def _send(self, request: urllib.request.Request) -> Answer:
        try:
            with self.opener.open(request, timeout=30) as response:
                return Answer(response.status, response.read().decode(), response.geturl())
        except urllib.error.HTTPError as error:
            return Answer(error.code, error.read().decode(), error.geturl())


@dataclass
class StatusPoll:
    """The order page's status block, polled as htmx polls it: GET with `HX-Request`, to the `?v=` URL the block
    carries; 204 leaves the block as it is, 200 (or 286, the last one) replaces it and its poll URL."""

    visitor: Visitor
    poll_url: str
    status: str
    database: Path  # the portal's SQLite file: what is committed, read beside what the page shows
    public_id: str
    unchanged_answers: int = 0
    seen: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, visitor: Visitor, order_path: str, database: Path) -> "StatusPoll":
        poll = cls(visitor, "", "", database, order_path.split("/")[2])
        poll._show(visitor.get(order_path).body)
        return poll

    def committed_status(self) -> str:
        with closing(sqlite3.connect(f"file:{self.database}?mode=ro", uri=True, timeout=30)) as database:
            query = "SELECT status FROM booking_order WHERE public_id = ?"
            return database.execute(query, (self.public_id,)).fetchone()[0]

    def _show(self, body: str) -> None:
        block = re.search(r'<section[^>]*id="order-status"[^>]*>', body).group(0)
        poll_url = re.search(r'hx-get="([^"]+)"', block)
        self.poll_url = html.unescape(poll_url.group(1)) if poll_url else ""
        self.status = re.search(r'class="status status-([a-z_]+)"', body).group(1)
        self.seen.append(self.status)

    def wait_for(self, status: str, *, since: float, logs: "Logs") -> float:
        """Poll until the block shows `status`; fail when more than STALE_POLLS polls sent after the database held
        it still showed another (the page is as fresh as the database, however slow the worker or beat), or after
        HANG_S. The seconds from `since` (time.monotonic()) to the poll that showed it, for the figures."""
        deadline = since + HANG_S
        asked = since
        stale = 0
        while self.status != status:
            if not self.poll_url:
                pytest.fail(f"the block stopped polling at {self.status!r} (seen: {self.seen}), not {status!r}")
            time.sleep(POLL_EVERY_S)
            asked = time.monotonic()
            if asked > deadline:
                pytest.fail(f"the order never reached {status!r} (seen: {self.seen})\n{logs.tail()}")
            committed = self.committed_status() == status
            answer = self.visitor.get(self.poll_url, htmx=True)
            if answer.status == 204:
                self.unchanged_answers += 1
            else:
                assert answer.status in (200, 286), answer
                self._show(answer.body)
            stale += committed and self.status != status
            assert stale <= STALE_POLLS, (
                f"the order page still shows {self.status!r} (seen: {self.seen}) {stale} polls after the database "
                f"held {status!r}\n{logs.tail()}"
            )
        return asked - since


@dataclass
class Logs:
    folder: Path

    def tail(self, lines: int = 25) -> str:
        return "\n".join(
            f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            for path in sorted(self.folder.glob("*.log"))
        )


@dataclass
class EmbeddedPortal:
    url: str
    env: dict
    chain: DevChain
    logs: Logs

    @property
    def database(self) -> Path:
        return Path(self.env["DATABASE_URL"].removeprefix("sqlite:///"))

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"manage.py {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout


def embedded_env(folder: Path, *, port: int, rpc_url: str) -> dict[str, str]:
    """`make run`'s environment, with its files in `folder` and its sweeps sooner. No Redis: REDIS_URL is set,
    empty, so that a .env file cannot bring it back."""
    env = {name: value for name, value in os.environ.items() if name not in ("DATABASE_URL", "REDIS_URL")}
    return {
        **env,
        "DEBUG": "1",
        "REDIS_URL": "",
        "DATABASE_URL": f"sqlite:///{folder / 'binome.sqlite3'}",
        "CACHE_FILE": str(folder / "cache.sqlite3"),
        "CELERY_BROKER_URL": f"sqla+sqlite:///{folder / 'celery-broker.sqlite3'}",
        "CELERY_RESULT_BACKEND": f"db+sqlite:///{folder / 'celery-results.sqlite3'}",
        "CELERY_BEAT_SCHEDULE_FILENAME": str(folder / "celerybeat-schedule"),
        "STATIC_ROOT": str(folder / "static"),
        "PROVISIONING_SSH_KEY_FILE": str(folder / "provisioning_ed25519"),
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "SITE_URL": f"http://127.0.0.1:{port}",
        "DEMO_RPC_URL": rpc_url,
        "WEB_CONCURRENCY": "2",
        "WORKER_CONCURRENCY": "2",
        "LOG_LEVEL": "INFO",
        "EXPIRE_HOLDS_EVERY_SECONDS": "1",  # make run: 30 s; the test waits for one sweep
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # as make run does
    }


def wait_until(ready, what: str, logs: Logs, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not ready in {timeout:.0f} s\n{logs.tail()}")
        time.sleep(0.2)


def web_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/livez", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
def embedded_portal(tmp_path):
    """The processes of `make run` (but the chain's, which is the tests' anvil), ready."""
    node = Anvil()
    node.start()
    port = free_port()
    env = embedded_env(tmp_path, port=port, rpc_url=node.url)
    logs = Logs(tmp_path)
    processes = []
    try:
        portal = EmbeddedPortal(
            url=f"http://127.0.0.1:{port}",
            env=env,
            chain=DevChain(config.parse_chains(chains_toml(node.url))[31337]),
            logs=logs,
        )
        portal.manage("migrate", "--no-input", "-v", "0")
        portal.manage("seed_demo")
        # Its visitors book as strangers, the only MI300X lot included: the share of a class that unconfirmed
        # addresses may hold (tests/booking/test_unconfirmed_share.py) is opened whole, before any process reads it.
        portal.manage(
            "shell", "-c", "from booking.models import BookingPolicy; "
            "BookingPolicy.objects.filter(pk=1).update(unconfirmed_share_percent=100)",
        )  # fmt: skip
        portal.manage("demo_chain", "setup")  # what bin/chain does once anvil answers
        portal.manage("prepare_broker")  # as make run: the queues exist before the worker and beat race for them
        for name in ("web", "worker", "beat"):
            with (tmp_path / f"{name}.log").open("w") as log:  # the child keeps its own copy of the descriptor
                processes.append(
                    subprocess.Popen(
                        [str(ROOT / "bin" / name)],
                        cwd=ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        wait_until(lambda: web_answers(portal.url), "gunicorn", logs)
        wait_until(lambda: " ready." in (tmp_path / "worker.log").read_text(), "the Celery worker", logs)
        wait_until(lambda: "beat: Starting" in (tmp_path / "beat.log").read_text(), "beat", logs)
        yield portal
    finally:
        stop_process_groups(processes, whole_group=False)
        node.stop()


def earliest_start(visitor: Visitor) -> date:
    page = visitor.get("/").body
    return date.fromisoformat(re.search(r'name="start_date"[^>]*\bmin="(\d{4}-\d{2}-\d{2})"', page).group(1))


def book(visitor: Visitor, *, choice: dict, start: date, email: str) -> Answer:
    """The booking form, filled in and sent (no JavaScript): the order page, or the page that refuses it."""
    terms_version = re.search(r'name="terms_version" value="(\d+)"', visitor.get("/").body).group(1)
    return visitor.post(
        "/",
        {
            **choice,
            "terms_version": terms_version,
            "accept_terms": "on",
            "lots": "1",
            "start_date": start.isoformat(),
            "days": "7",
            "contact_name": "Ada Lovelace",
            "contact_email": email,
            "organisation": "Analytical Engines Lab",
            "billing_address": "12 rue de la Paix\n75002 Paris",
            "billing_country": "FR",
            "ssh_keys": make_ssh_key(),
            **RESEARCH_ANSWERS,
        },
    )


def order_path(answer: Answer) -> str:
    path = urllib.parse.urlsplit(answer.url).path
    assert ORDER_PATH.fullmatch(path), f"not placed: {answer.status} {answer.url}\n{answer.body[:2000]}"
    return path


def free_lots(visitor: Visitor, *, choice: dict, start: date) -> str:
    """The booking page as a new visitor loads it, for one lot of `choice` from `start`: its "free / total"."""
    query = urllib.parse.urlencode({**choice, "lots": "1", "start_date": start.isoformat(), "days": "7"})
    page = visitor.get(f"/?{query}").body
    chosen = re.search(r'<tr class="chosen">.*?</tr>', page, re.DOTALL).group(0)
    return re.search(r'<td class="(?:free|none)">(\d+ / \d+)</td>', chosen).group(1)


def assert_no_longer_unchanged(visitor: Visitor, poll_url: str) -> None:
    """A block drawn before the change is never answered "unchanged" (204) again, whichever web worker answers."""
    answers = [visitor.get(poll_url, htmx=True).status for _ in range(8)]
    assert 204 not in answers, answers


def operator_clicks(operator: Visitor, public_id: str, action: str) -> None:
    """The console's button for `action` on the order's page, as the operator presses it."""
    console_page = f"/console/orders/{public_id}/"
    answer = operator.post(f"{console_page}{action}/", {}, form_page=console_page)
    from django.utils import translation

    from web.console.views import ACTION_NAMES

    with translation.override("en"):  # the operator reads English; another test may have left French active
        done = f"{public_id}: {ACTION_NAMES[action]} done."
    assert answer.status == 200 and done in answer.body, answer.body[:2000]


def test_changes_made_by_the_worker_and_beat_show_on_the_next_poll_and_page_load(embedded_portal):
    portal = embedded_portal
    researcher = Visitor(portal.url)
    health = json.loads(researcher.get("/healthz").body)
    assert health["status"] == "ok" and health["checks"]["broker"]["detail"] == "sqla", health  # no Redis
    earliest = earliest_start(researcher)

    # A researcher books a B200 pair a week ahead and pays as a wallet would; the transfer is seen.
    placed = order_path(book(researcher, choice=B200, start=earliest + timedelta(days=7), email="ada@example.org"))
    public_id = placed.split("/")[2]
    poll = StatusPoll.open(researcher, placed, portal.database)
    assert poll.status == "awaiting_payment"
    link = re.search(r'href="(ethereum:[^"]+)"', researcher.get(placed).body).group(1)
    pay_link(html.unescape(link), portal.chain)
    poll.wait_for("payment_processing", since=time.monotonic(), logs=portal.logs)

    # The blocks that make it final (3 confirmations): the worker settles it, the page shows it on its next poll.
    drawn_before = poll.poll_url
    portal.chain.mine(2)
    paid_after = poll.wait_for("paid", since=time.monotonic(), logs=portal.logs)
    assert_no_longer_unchanged(researcher, drawn_before)

    # The operator logs in to the console, approves (the window is a week away: nothing starts), provisions.
    operator = Visitor(portal.url)
    login = operator.post(
        "/admin/login/?next=/console/",
        {"username": DEMO_OPERATOR_USERNAME, "password": DEMO_OPERATOR_PASSWORD, "next": "/console/"},
    )
    assert urllib.parse.urlsplit(login.url).path == "/console/", login.body[:2000]
    operator_clicks(operator, public_id, "approve")
    poll.wait_for("approved", since=time.monotonic(), logs=portal.logs)
    drawn_before = poll.poll_url
    clicked = time.monotonic()
    operator_clicks(operator, public_id, "provision")
    ready_after = poll.wait_for("ready", since=clicked, logs=portal.logs)
    assert_no_longer_unchanged(researcher, drawn_before)
    assert poll.unchanged_answers > 0  # the "unchanged" answers were the cached ones, and still let changes through

    # Another researcher holds the only MI300X lot: the booking page, and a booking of it, say it is taken.
    start = earliest + timedelta(days=14)
    visitor = Visitor(portal.url)
    assert free_lots(visitor, choice=MI300X, start=start) == "1 / 1"
    holder = Visitor(portal.url)
    held = order_path(book(holder, choice=MI300X, start=start, email="grace@example.org"))
    for _ in range(4):  # drawn, then served from the cache by either web worker
        assert free_lots(visitor, choice=MI300X, start=start) == "0 / 1"
    refused = book(Visitor(portal.url), choice=MI300X, start=start, email="katherine@example.org")
    assert 'id="sold-out"' in refused.body, refused.url  # nothing booked, for now

    # The hold runs out (the clock, moved by a queryset update: no signal, nothing invalidated), beat's sweep
    # releases the lot; the very next page load shows it free, and booking it goes through.
    held_poll = StatusPoll.open(holder, held, portal.database)
    portal.manage(
        "shell",
        "-c",
        "from django.utils import timezone; from booking.models import Order; "
        f"Order.objects.filter(public_id={held.split('/')[2]!r}).update(hold_expires_at=timezone.now())",
    )
    expired_after = held_poll.wait_for("expired", since=time.monotonic(), logs=portal.logs)
    assert free_lots(visitor, choice=MI300X, start=start) == "1 / 1"
    order_path(book(Visitor(portal.url), choice=MI300X, start=start, email="katherine@example.org"))

    print(
        f"paid {paid_after:.1f} s after the final confirmation, ready {ready_after:.1f} s after the click, "
        f"hold released by beat {expired_after:.1f} s after it ran out"
    )


def test_make_run_installs_what_the_demo_needs_and_nothing_only_the_tests_use():
    """On a fresh clone `make run` installs the project with its `embedded` extra, the chain's npm packages and the
    Debian packages the demo uses (gettext, Pango and fonts for the invoices): not PyTorch, Playwright, Chromium,
    podman, sshd or nginx, which only `make test` needs. `make -n -B` prints every command a fresh clone would run."""
    planned = subprocess.run(
        ["make", "-n", "-B", "run"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert 'pip install --quiet -e ".[embedded]"' in planned and "npm ci" in planned
    assert "libpango" in planned and "gettext" in planned
    for only_the_tests in ("[dev", "trial", "chromium", "podman", "openssh-server", "nginx", "mmdebstrap"):
        assert only_the_tests not in planned, only_the_tests
    tested = subprocess.run(["make", "-n", "-B", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert '-e ".[dev,trial,embedded]"' in tested and "chromium" in tested
