"""Faults as a researcher meets them, with the real services stopped and started by the tests: Redis while they
press "I've paid", the chain's RPC node during confirmations, the database connection in the middle of a booking.
(The provisioning worker killed mid-run is in tests/provisioning/test_ssh_provisioning.py.)"""

import shutil
import subprocess
import threading
import time
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from booking.models import Allocation, Order, OrderSshKey, OrderStatus
from payments.models import ChainCursor, DerivationSlot, Invoice
from portal.celery import app as celery_app
from tests.browser.conftest import chain_for_live_server, start_worker_and_beat
from tests.browser.steps import fill_booking, pay_as_a_wallet, place_order
from tests.payments.conftest import deployed_anvil, free_port

pytestmark = pytest.mark.integration

DELAYED = "Check delayed: the network is not answering right now."


class RedisServer:
    """Debian's redis-server on a free port, without persistence, that a test can stop and start again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is missing: .ci/run installs Debian's redis-server", pytrace=False)
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout != b"PONG\n":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def redis_server():
    server = RedisServer()
    server.start()
    yield server
    if server.process.poll() is None:
        server.stop()


def confirm_and_watch_it_paid(page, chain, order) -> None:
    """The remaining confirmations; the page turns to "paid" by itself and no longer says the check is delayed."""
    chain.mine(2)
    try:  # two minutes: after a broker's restart the worker and beat reconnect first, on a machine that may be busy
        page.locator("#order-status").get_by_text("Paid: ").wait_for(timeout=120000)
    except PlaywrightTimeoutError:
        order.refresh_from_db()  # which side was late: the settlement, or the page's poll
        invoice = Invoice.objects.filter(order=order).first()
        raise AssertionError(f"page not paid; order {order.status}, invoice {invoice and invoice.status}") from None
    assert DELAYED not in page.inner_text("#order-status")
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID


def _use_broker(url: str | None) -> None:
    celery_app.conf.broker_url = url
    # As Celery does after a fork: the next publish builds a pool for the current broker URL.
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


def test_redis_stopped_while_the_researcher_presses_ive_paid(
    page, live_server, live_chain, catalog, start_celery_worker, redis_server, settings
):
    """The click is kept, the page says the check is delayed, and once Redis is back the payment is found
    without another click."""
    chain, chains_path = live_chain
    settings.CACHES = {
        "default": {
            "BACKEND": "infrastructure.cache.ResilientRedisCache",
            "LOCATION": redis_server.url,
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 2},
        }
    }
    original_broker = celery_app.conf.broker_url
    _use_broker(redis_server.url)
    stop_beat = start_worker_and_beat(start_celery_worker, chains_path, REDIS_URL=redis_server.url)
    try:
        order = place_order(page, live_server.url)

        redis_server.stop()
        receipt = pay_as_a_wallet(page, chain)
        page.fill("input[name=tx_hint]", receipt["transactionHash"])
        page.click("text=I've paid")
        page.locator("#order-status").get_by_text(DELAYED).wait_for(timeout=30000)
        assert "You told us you paid" in page.inner_text("#order-status")
        invoice = Invoice.objects.get(order=order)
        assert invoice.customer_paid_at is not None and invoice.customer_tx_hint == receipt["transactionHash"]
        assert invoice.status == Invoice.Status.NEW  # nothing could look at the chain meanwhile

        redis_server.start()  # an empty Redis: whatever was queued before is gone, the click is in the database
        page.locator("#order-status").get_by_text("confirmations").wait_for(timeout=60000)
        confirm_and_watch_it_paid(page, chain, order)
    finally:
        stop_beat()
        _use_broker(original_broker)


@pytest.fixture
def restartable_chain(transactional_db, settings, tmp_path):
    """A chain node of this test's own, whose state survives a stop and a start."""
    with (
        deployed_anvil(state=tmp_path / "anvil-state.json") as node,
        chain_for_live_server(node, settings, tmp_path) as (client, path),
    ):
        yield node, client, path


def test_the_rpc_node_stopped_during_confirmations(page, live_server, restartable_chain, catalog, start_celery_worker):
    """Nothing changes while it is down, the page says so, and detection resumes when it returns."""
    node, chain, chains_path = restartable_chain
    stop_beat = start_worker_and_beat(start_celery_worker, chains_path)
    try:
        order = place_order(page, live_server.url)
        pay_as_a_wallet(page, chain)
        page.click("text=I've paid")
        page.locator("#order-status").get_by_text("1/3 confirmations").wait_for(timeout=30000)

        node.stop()
        page.locator("#order-status").get_by_text(DELAYED).wait_for(timeout=60000)
        assert "1/3 confirmations" in page.inner_text("#order-status")  # what was seen stays as it was
        invoice = Invoice.objects.get(order=order)
        order.refresh_from_db()
        assert invoice.status == Invoice.Status.PROCESSING and order.status == OrderStatus.PAYMENT_PROCESSING
        assert ChainCursor.objects.get(chain_id=invoice.chain_id).unavailable_since is not None  # the page's source

        node.start()  # the same chain, read back from its state file
        confirm_and_watch_it_paid(page, chain, order)
    finally:
        stop_beat()


@contextmanager
def connection_dropped_at_the_invoice():
    """Hold the invoice table so a booking waits there, with its order and allocations already written in its
    transaction; then end that session from PostgreSQL's side, as a restart or a network cut would."""
    db = connection.settings_dict
    params = {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "dbname": db["NAME"]}
    locker = psycopg.connect(**params)
    locker.execute("LOCK TABLE payments_invoice IN ACCESS EXCLUSIVE MODE")
    # A second session watches: inside the locker's transaction, pg_stat_activity would stay as first read.
    watcher = psycopg.connect(**params, autocommit=True)
    terminated: list[int] = []

    def terminate_the_waiting_booking() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not terminated:
            row = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
                "AND pid <> pg_backend_pid() AND query ILIKE '%payments_invoice%'"
            ).fetchone()
            if row:
                watcher.execute("SELECT pg_terminate_backend(%s)", row)
                terminated.append(row[0])
            time.sleep(0.02)
        locker.rollback()

    thread = threading.Thread(target=terminate_the_waiting_booking)
    thread.start()
    try:
        yield terminated
    finally:
        thread.join()
        locker.close()
        watcher.close()


def test_the_database_connection_dropped_during_a_booking(page, live_server, live_chain, catalog):
    """The researcher gets the form back with what they typed and a message to retry; no half-made order."""
    page.goto(live_server.url + "/")
    fill_booking(page, lots="2", email="grace@example.org")
    typed_key = page.input_value("textarea[name=ssh_keys]")
    with connection_dropped_at_the_invoice() as terminated:
        page.click("button.button-primary")
        page.get_by_text("our database stopped answering for a moment").wait_for(timeout=30000)
    assert terminated, "the booking never reached the invoice"

    assert page.input_value("input[name=contact_email]") == "grace@example.org"
    assert page.input_value("textarea[name=ssh_keys]") == typed_key
    assert page.input_value("input[name=lots]") == "2"
    assert Order.objects.count() == 0
    assert Allocation.objects.count() == 0 and OrderSshKey.objects.count() == 0
    assert Invoice.objects.count() == 0 and DerivationSlot.objects.count() == 0
    assert "6 / 6" in page.inner_text("#quote")  # the lots are still free

    page.click("button.button-primary")  # the same answers, sent again
    page.wait_for_url(lambda url: "/orders/BN-" in url)
    order = Order.objects.get()
    assert order.contact_email == "grace@example.org" and order.allocations.count() == 2
