"""Browser journeys: Playwright driving Debian's Chromium (/usr/bin/chromium) against a live server, with the real
PostgreSQL, Redis, anvil and a real Celery worker and beat. Screenshots go to test-artifacts/ (not committed)."""

import os
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from payments import config
from payments.chain import ChainUnavailable
from payments.chain_demo import DevChain
from payments.demo import DEMO_USDT_RATE
from payments.models import OperatorRate
from tests.browser.steps import PASSWORD
from tests.payments.conftest import chains_toml
from tests.processes import beat_argv, process_env_for_tests, stop_process_groups
from tests.provisioning.conftest import (  # noqa: F401 (fixtures of the operator journey)
    admin,
    environment_images,
    fake_gpus,
    loopback_host,
    reserved_ports_restored,
    sshd,
    test_image,
)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# What Playwright starts: Debian's Chromium in a network namespace of its own (see the file for why).
BROWSER = str(Path(__file__).with_name("isolated_chromium.py"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls are still synchronous
    # (Django documents this switch for such callers).
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (make system-deps)", pytrace=False)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=BROWSER, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1200, "height": 1400})
    page = context.new_page()
    yield page
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()


@pytest.fixture
def new_page(browser):
    """`new_page()`: a page in a browser context of its own (another person at another computer), closed after
    the test so that its polling stops with it."""
    contexts = []

    def make(**options):
        context = browser.new_context(**{"viewport": {"width": 1200, "height": 1400}, **options})
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


@contextmanager
def chain_for_live_server(node, settings, tmp_path: Path):
    """The demo chain on `node` for a live server, a worker and beat (a committed database): (client, chains file)."""
    path = tmp_path / "chains.toml"
    path.write_text(chains_toml(node.url, confirmations=3))
    settings.PAYMENTS_CHAINS_FILE = str(path)
    OperatorRate.objects.create(
        chain_id=31337, asset_symbol="dUSDT", fiat_currency=settings.PRICE_CURRENCY, rate=DEMO_USDT_RATE
    )
    client = DevChain(config.chain(31337))
    snapshot = client.snapshot()
    yield client, path
    with suppress(ChainUnavailable):  # a node a test stopped for good has nothing to revert
        client.revert(snapshot)


@pytest.fixture
def live_chain(anvil, transactional_db, settings, tmp_path):
    """The session's anvil, reverted after the test."""
    with chain_for_live_server(anvil, settings, tmp_path) as chain:
        yield chain


def start_worker_and_beat(start_celery_worker, chains_path: Path, **extra_env: str) -> Callable[[], None]:
    """A real worker, and beat scanning the chain every second; returns the function that stops beat (the
    worker is stopped by `start_celery_worker`)."""
    env = {
        "PAYMENTS_CHAINS_FILE": str(chains_path),
        "PAYMENTS_SCAN_SECONDS": "1",
        "EXPIRE_HOLDS_EVERY_SECONDS": "3600",
        "LIFECYCLE_EVERY_SECONDS": "3600",
        **extra_env,
    }
    start_celery_worker(**env)
    beat = subprocess.Popen(
        beat_argv(Path(tempfile.mkdtemp()) / "beat-schedule"), env=process_env_for_tests(**env), start_new_session=True
    )

    def stop() -> None:
        stop_process_groups([beat])

    return stop


@pytest.fixture
def worker_and_beat(live_chain, start_celery_worker):
    _client, path = live_chain
    stop = start_worker_and_beat(start_celery_worker, path)
    yield
    stop()


@pytest.fixture
def browser_page(page):
    page.on("dialog", lambda dialog: dialog.accept())  # the form's confirmation
    page.refused = []
    page.on("response", lambda response: response.status == 403 and page.refused.append(response.url))
    return page


@pytest.fixture
def operator(transactional_db):
    user = get_user_model().objects.create_user("olga", "olga@binome.example", PASSWORD, is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="operate_orders"))
    return user


@pytest.fixture
def researcher(page):
    page.on("dialog", lambda dialog: dialog.accept())
    page.refused = []
    page.on("response", lambda response: response.status == 403 and page.refused.append(response.url))
    return page
