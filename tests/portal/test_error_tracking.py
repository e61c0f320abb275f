"""Sentry, when SENTRY_DSN is set (portal/settings.py): a production process reports a failing order page to a
Sentry server of the test's own, and no byte of what it sends carries the order's token; without SENTRY_DSN the
SDK is never started. Sentry starts in real processes only: once started, it stays for the process's life."""

import gzip
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import brotli
import pytest

from tests.builders.production import NOT_DEMO_XPUB, PRODUCTION_SECRET_KEY, _production

PUBLIC_ID = "BN-ABCD2345"
TOKEN = "Zk3-secret_token_value_of_forty_three_chars0"

# The order page of a link, served by the portal's WSGI application and made to fail where it reads the order,
# with the token everywhere Sentry looks: the URL, the query string (a percent-encoded `next`), the Referer, a log
# line (a breadcrumb), the exception's message (in a link and on its own) and the frames' variables.
FAILING_ORDER_PAGE = f"""
import logging
import threading
import urllib.error
import urllib.request
from unittest import mock
from wsgiref.simple_server import WSGIRequestHandler, make_server

import sentry_sdk

from booking import selectors
from portal.wsgi import application

def order_for_link(*, public_id, token):
    logging.getLogger("web.customer").warning("looking for the order behind /orders/%s/%s/", public_id, token)
    raise RuntimeError(f"no order behind /orders/{{public_id}}/{{token}}/ (token {{token}})")

class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass

with mock.patch.object(selectors, "order_for_link", order_for_link):
    server = make_server("127.0.0.1", 0, application, handler_class=Quiet)
    threading.Thread(target=server.handle_request).start()
    request = urllib.request.Request(
        f"http://127.0.0.1:{{server.server_port}}/orders/{PUBLIC_ID}/{TOKEN}/?next=%2Forders%2F{PUBLIC_ID}%2F{TOKEN}%2F",
        headers={{
            "Host": "book.example.org",
            "X-Forwarded-Proto": "https",
            "Referer": "https://book.example.org/orders/{PUBLIC_ID}/{TOKEN}/",
        }},
    )
    try:
        urllib.request.urlopen(request, timeout=30)
    except urllib.error.HTTPError as error:
        print("status", error.code)
sentry_sdk.flush(timeout=10)
"""

# What the portal does besides its pages: a request to an RPC provider whose URL holds its API key (as a chains
# file's may), three requests for a host the portal does not serve (anyone can send them, as often as they like),
# then a customer's address refused by the mail server, the mail task's error once its retries run out.
PORTAL_CALLS = """
import smtplib
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from wsgiref.simple_server import WSGIRequestHandler, make_server

import requests
import sentry_sdk
from django.conf import settings
from django.core import mail

from portal.wsgi import application

settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
mail.outbox = []
seen = []

class Provider(BaseHTTPRequestHandler):
    def do_GET(self):
        seen.append(sorted(name.lower() for name in self.headers))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass

class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass

provider = ThreadingHTTPServer(("127.0.0.1", 0), Provider)
threading.Thread(target=provider.serve_forever, daemon=True).start()
# the secrets spelled apart: the process's command line, which holds this script, is in every event (sys.argv)
rpc = f"http://127.0.0.1:{provider.server_address[1]}/v2/" + "SUPERSECRET" "APIKEY123?apikey=" + "QUERY" "KEY456"
print("rpc", requests.get(rpc, timeout=10).status_code)
server = make_server("127.0.0.1", 0, application, handler_class=Quiet)
threading.Thread(target=server.serve_forever, daemon=True).start()
for _ in range(3):
    request = urllib.request.Request(f"http://127.0.0.1:{server.server_port}/", headers={"Host": "evil" ".example"})
    try:
        urllib.request.urlopen(request, timeout=30)
    except urllib.error.HTTPError as error:
        print("bad host", error.code)
try:
    raise smtplib.SMTPRecipientsRefused({"ada.lovelace" "@lab.example.org": (550, b"5.1.1 no such user")})
except smtplib.SMTPRecipientsRefused:
    sentry_sdk.capture_exception()
sentry_sdk.flush(timeout=10)
print("mails", len(mail.outbox))
print("provider saw", seen[0])
"""

PRINT_SENTRY = (
    "import sys; loaded = 'sentry_sdk' in sys.modules; import sentry_sdk; client = sentry_sdk.get_client(); "
    "print(loaded, sentry_sdk.is_initialized(), sorted(client.integrations) if client.is_active() else [])"
)


@pytest.fixture
def sentry_server():
    """A Sentry ingestion endpoint on 127.0.0.1: what reaches it, decompressed, as (path, body) pairs."""
    received: list[tuple[str, bytes]] = []

    class Ingestion(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            elif self.headers.get("Content-Encoding") == "br":  # where brotli is installed: the image has it
                body = brotli.decompress(body)
            received.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ingestion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], received
    server.shutdown()
    server.server_close()
    thread.join()


def _events(envelope: bytes) -> list[dict]:
    """The error events of an envelope (a header line, then each item's header line and payload line)."""
    lines = [json.loads(line) for line in envelope.splitlines() if line.strip()]
    return [line for line in lines if isinstance(line, dict) and "exception" in line]


def _production_settings(production_chains, **env: str | None) -> dict[str, str | None]:
    return {
        "SECRET_KEY": PRODUCTION_SECRET_KEY,
        "PAYMENTS_XPUB": NOT_DEMO_XPUB,
        "PAYMENTS_CHAINS_FILE": str(production_chains),
        **env,
    }


def test_a_failing_order_page_reaches_sentry_without_its_token(sentry_server, production_chains):
    port, received = sentry_server

    result = _production(
        "shell",
        "-c",
        FAILING_ORDER_PAGE,
        **_production_settings(production_chains, SENTRY_DSN=f"http://publickey@127.0.0.1:{port}/1"),
    )

    assert result.returncode == 0 and "status 500" in result.stdout, result.stderr[-3000:]
    events = [event for _path, body in received for event in _events(body)]
    assert len(events) == 1, received
    (event,) = events
    assert {path for path, _body in received} == {"/api/1/envelope/"}
    assert event["exception"]["values"][-1]["type"] == "RuntimeError"
    assert event["exception"]["values"][-1]["value"] == (
        f"no order behind /orders/{PUBLIC_ID}/[token]/ (token [token])"
    )
    assert event["request"]["url"] == f"http://book.example.org/orders/{PUBLIC_ID}/[token]/"  # wsgiref's scheme
    assert event["request"]["query_string"] == f"next=%2Forders%2F{PUBLIC_ID}%2F[token]%2F"
    assert event["request"]["headers"]["Referer"] == f"https://book.example.org/orders/{PUBLIC_ID}/[token]/"
    assert event["environment"] == "production"
    assert not any("vars" in frame for value in event["exception"]["values"] for frame in value["stacktrace"]["frames"])
    assert any("looking for the order behind" in crumb.get("message", "") for crumb in event["breadcrumbs"]["values"])
    for _path, body in received:  # every byte sent, not only the event's fields the assertions above read
        assert TOKEN.encode() not in body


def test_a_task_failing_with_an_order_link_reaches_sentry_without_its_token(sentry_server, start_celery_worker):
    """A worker's event: the exception's message and the log line before it (the task's arguments, which hold the
    link too, are left out by the SDK itself without send_default_pii)."""
    from portal.celery import app

    port, received = sentry_server
    start_celery_worker(include=("tests.builders.leaky_tasks",), SENTRY_DSN=f"http://publickey@127.0.0.1:{port}/1")

    app.send_task("tests.leak_an_order_link", args=[f"https://book.example.org/orders/{PUBLIC_ID}/{TOKEN}/"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(_events(body) for _path, body in received):
        time.sleep(0.2)

    (event,) = [event for _path, body in received for event in _events(body)]
    assert event["exception"]["values"][-1]["value"] == (
        f"could not reach https://book.example.org/orders/{PUBLIC_ID}/[token]/"
    )
    assert event["extra"]["celery-job"]["task_name"] == "tests.leak_an_order_link"
    assert f"sending the order's link https://book.example.org/orders/{PUBLIC_ID}/[token]/" in [
        crumb.get("message") for crumb in event["breadcrumbs"]["values"]
    ]
    assert event["environment"] == "development"  # the tests' DEBUG=1
    for _path, body in received:
        assert TOKEN.encode() not in body


def test_sentry_is_sent_no_api_key_of_a_called_url_no_customer_address_and_no_flood_of_foreign_hosts(
    sentry_server, production_chains
):
    port, received = sentry_server

    result = _production(
        "shell",
        "-c",
        PORTAL_CALLS,
        **_production_settings(
            production_chains, SENTRY_DSN=f"http://publickey@127.0.0.1:{port}/1", ADMINS="ops@lab.example.org"
        ),
    )

    assert result.returncode == 0 and "rpc 200" in result.stdout, result.stderr[-3000:]
    # the foreign hosts are refused, and neither an event nor an e-mail each
    assert result.stdout.count("bad host 400") == 3 and "mails 0" in result.stdout
    events = [event for _path, body in received for event in _events(body)]
    assert [event["exception"]["values"][-1]["type"] for event in events] == ["SMTPRecipientsRefused"], events
    (event,) = events
    assert event["exception"]["values"][-1]["value"] == "{'[email]': (550, b'5.1.1 no such user')}"
    # the requests made (to the provider, and the three to the portal) are in the breadcrumbs by their server only
    calls = [crumb["data"] for crumb in event["breadcrumbs"]["values"] if crumb.get("type") == "http"]
    assert len(calls) == 4 and all(re.fullmatch(r"http://127\.0\.0\.1:\d+", call["url"]) for call in calls), calls
    assert not any("http.query" in call for call in calls)
    # and the provider was not told the DSN's key or the task (no trace headers)
    assert "sentry-trace" not in result.stdout and "baggage" not in result.stdout
    for _path, body in received:
        for secret in (b"SUPERSECRETAPIKEY123", b"QUERYKEY456", b"ada.lovelace@", b"evil.example"):
            assert secret not in body, secret


def test_without_a_dsn_sentry_is_not_started(production_chains):
    started = _production(
        "shell",
        "-c",
        PRINT_SENTRY,
        **_production_settings(production_chains, SENTRY_DSN="http://publickey@127.0.0.1:9/1"),
    )
    unset = _production("shell", "-c", PRINT_SENTRY, **_production_settings(production_chains, SENTRY_DSN=None))
    empty = _production("shell", "-c", PRINT_SENTRY, **_production_settings(production_chains, SENTRY_DSN=""))

    assert started.stdout.splitlines()[-1].startswith("True True ["), started.stderr[-2000:]
    assert "'celery'" in started.stdout and "'django'" in started.stdout
    assert unset.stdout.splitlines()[-1] == "False False []", unset.stderr[-2000:]  # not even imported
    assert empty.stdout.splitlines()[-1] == "False False []", empty.stderr[-2000:]


def test_a_sample_rate_outside_zero_to_one_is_refused(production_chains):
    result = _production(
        "check",
        **_production_settings(
            production_chains, SENTRY_DSN="http://publickey@127.0.0.1:9/1", SENTRY_TRACES_SAMPLE_RATE="20"
        ),
    )

    assert result.returncode != 0 and "SENTRY_TRACES_SAMPLE_RATE must be between 0" in result.stderr
