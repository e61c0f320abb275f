"""A lab that serves the portal on its own network over plain http (SITE_URL_PRIVATE_NETWORK): production settings,
gunicorn (bin/web) and Chromium opening it under a name that is not loopback, as the lab's researchers would.

Chromium keeps no `Secure` cookie for a plain-http site that is not loopback: production's https-only CSRF and
session cookies would be dropped and every form refused. The cookies follow SITE_URL's scheme; this is the proof."""

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from booking.models import OrderStatus
from tests.browser.conftest import BROWSER, CHROMIUM_ARGS, ROOT
from tests.browser.steps import ORDER_URL, place_order
from tests.builders.production import NOT_DEMO_XPUB, PRODUCTION_CHAINS, PRODUCTION_SECRET_KEY
from tests.payments.conftest import free_port
from tests.processes import process_env_for_tests

pytestmark = pytest.mark.integration

LAB_HOST = "binome.lab.internal"  # what the lab's DNS (or /etc/hosts) would name the portal


@pytest.fixture
def lab_portal(transactional_db, catalog, tmp_path):
    """gunicorn with production settings (DEBUG off) on the test database, at http://binome.lab.internal:<port>."""
    port = free_port()
    chains = tmp_path / "chains.toml"
    chains.write_text(PRODUCTION_CHAINS)
    site = f"http://{LAB_HOST}:{port}"
    environment = process_env_for_tests(
        DEBUG="0",
        SECRET_KEY=PRODUCTION_SECRET_KEY,
        SITE_URL=site,
        SITE_URL_PRIVATE_NETWORK="1",
        ALLOWED_HOSTS=LAB_HOST,
        EMAIL_URL="smtp://127.0.0.1:9",  # nothing listens: no e-mail leaves the test
        DEFAULT_FROM_EMAIL=f"Binôme <bookings@{LAB_HOST}>",
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(chains),
        PROVISIONING_SSH_KEY_FILE=str(tmp_path / "no-key-here"),
        STATIC_ROOT=str(tmp_path / "static"),
        HOST="127.0.0.1",
        PORT=str(port),
        WEB_CONCURRENCY="1",
        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",  # gunicorn, from the virtualenv
    )
    environment.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    collected = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert collected.returncode == 0, collected.stderr[-3000:]
    log = tmp_path / "web.log"
    with log.open("w") as output:
        web = subprocess.Popen(
            ["bash", "bin/web"],
            cwd=ROOT,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5)
                break
            except urllib.error.HTTPError:
                break  # answered (400: 127.0.0.1 is not the lab's host name)
            except OSError:
                assert web.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
        yield site
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)


@pytest.fixture
def lab_browser(browser):
    """Chromium that resolves the lab's name to this machine, as the lab's DNS would."""
    chromium = browser.browser_type.launch(
        executable_path=BROWSER, args=[*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {LAB_HOST} 127.0.0.1"]
    )
    yield chromium
    chromium.close()


def test_a_lab_on_plain_http_books_switches_language_and_cancels_in_chromium(lab_portal, lab_browser):
    context = lab_browser.new_context(viewport={"width": 1200, "height": 1400})
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    refused = []
    page.on("response", lambda response: response.status == 403 and refused.append(response.url))

    order = place_order(page, lab_portal, email="lab@example.org")
    assert not refused and page.url.startswith(lab_portal)
    cookies = {cookie["name"]: cookie for cookie in context.cookies()}
    assert "csrftoken" in cookies and not cookies["csrftoken"]["secure"]

    with page.expect_navigation():
        page.select_option("#language-select", "fr")
    assert not refused and ORDER_URL.fullmatch(page.url) and page.get_attribute("html", "lang") == "fr"

    with page.expect_navigation():
        page.get_by_role("button", name="Annuler cette commande").click()
    assert not refused, refused
    assert "Votre commande est annulée et ses lots sont libérés." in page.inner_text("ul.messages")
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED
    context.close()
