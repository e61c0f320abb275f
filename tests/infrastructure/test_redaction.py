"""No log line and no error report carries an order's secret token: gunicorn's access log, Django's request log
and the error report mailed to ADMINS."""

import io
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.test import RequestFactory
from django.views.debug import get_exception_reporter_class

from tests.builders.orders import place

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "Zk3-secret_token_value_of_forty_three_chars0"


def _console_output(emit) -> str:
    handler = next(h for h in logging.getLogger().handlers if getattr(h, "name", "") == "console")
    stream = io.StringIO()
    previous = handler.setStream(stream)
    try:
        emit()
    finally:
        handler.setStream(previous)
    return stream.getvalue()


@pytest.mark.django_db
def test_the_request_log_of_a_wrong_or_right_link_names_the_order_not_its_token(client, catalog, booking_data):
    order, token = place(client, booking_data())

    output = _console_output(
        lambda: (
            client.get(f"/orders/{order.public_id}/{TOKEN}/"),
            logging.getLogger("django.request").error(
                "Internal Server Error: %s", f"/orders/{order.public_id}/{token}/"
            ),
        )
    )

    assert f"Not Found: /orders/{order.public_id}/[token]/" in output
    assert f"Internal Server Error: /orders/{order.public_id}/[token]/" in output
    assert TOKEN not in output and token not in output


@pytest.mark.django_db
def test_the_error_report_for_admins_carries_no_token(catalog):
    request = RequestFactory().get(
        f"/orders/BN-ABCD2345/{TOKEN}/",
        {"v": "0123456789abcdef"},
        HTTP_REFERER=f"https://x/orders/BN-ABCD2345/{TOKEN}/",
    )
    from django.urls import resolve

    request.resolver_match = resolve(f"/orders/BN-ABCD2345/{TOKEN}/")
    try:
        token = request.resolver_match.kwargs["token"]  # a frame variable holding the token, as in a view
        raise RuntimeError(f"boom for {token}")
    except RuntimeError:
        reporter = get_exception_reporter_class(request)(request, *sys.exc_info())
        text, page = reporter.get_traceback_text(), reporter.get_traceback_html()

    assert "BN-ABCD2345" in text and "RuntimeError" in text
    assert TOKEN not in text and TOKEN not in page


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_gunicorns_access_log_carries_no_token_not_even_the_poll_url(tmp_path):
    port = _free_port()
    environment = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",  # gunicorn, from the virtualenv
        "DEBUG": "1",
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "WEB_CONCURRENCY": "1",
    }
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
        poll = f"http://127.0.0.1:{port}/orders/BN-ABCD2345/{TOKEN}/?v=0123456789abcdef"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(poll, timeout=5)
            except urllib.error.HTTPError:
                break  # answered (404, or 503 without a database): logged
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
        time.sleep(0.5)
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)
    written = log.read_text()
    assert '"GET /orders/BN-ABCD2345/[token]/?v=0123456789abcdef HTTP/1.1"' in written, written
    assert TOKEN not in written


def test_gunicorns_error_log_carries_no_token(tmp_path):
    """What a worker writes when a request fails ("Error handling request /orders/…", its traceback) goes to
    gunicorn's error log, not through Django's loggers: the logger class filters it too."""
    from gunicorn.config import Config

    from infrastructure.redaction import RedactingGunicornLogger

    config = Config()
    config.set("errorlog", str(tmp_path / "error.log"))
    logger = RedactingGunicornLogger(config)
    try:
        raise RuntimeError("worker failed")
    except RuntimeError:
        logger.exception("Error handling request %s", f"/orders/BN-ABCD2345/{TOKEN}/?v=0123456789abcdef")
    logger.error("Invalid request from ip=%s: %s", "198.51.100.7", f"GET /orders/BN-ABCD2345/{TOKEN}/ HTTP/1.1")
    for handler in logger.error_log.handlers:
        handler.flush()

    written = (tmp_path / "error.log").read_text()
    assert "Error handling request /orders/BN-ABCD2345/[token]/" in written and "worker failed" in written
    assert TOKEN not in written


@pytest.mark.parametrize(
    "spelling",
    [
        "/orders/BN-ABCD2345/{token}/",
        "/orders/BN%2DABCD2345/{token}/",  # the number escaped: Django decodes it and opens the order
        "/orders/BN-ABCD2345/{escaped}/events/",  # the token's own `-` escaped (a link rewriter)
        "/orders/BN-ABCD2345/{escaped_lower}/",
        "/%6Frders/BN-ABCD2345/{token}/",
        "/login/?next=%2Forders%2FBN-ABCD2345%2F{escaped}%2Fpaid%2F",  # a whole link inside a parameter
        "/login/?next=%2Forders%2FBN%252DABCD2345%2F{token}%2F",  # escaped twice
    ],
)
def test_every_spelling_of_an_order_link_loses_its_token(spelling):
    from infrastructure.redaction import redact

    line = spelling.format(token=TOKEN, escaped=TOKEN.replace("-", "%2D"), escaped_lower=TOKEN.replace("-", "%2d"))
    redacted = redact(f"GET {line} HTTP/1.1")
    assert "[token]" in redacted and "secret" not in redacted, redacted


def test_a_worker_s_log_carries_no_token_of_a_task_s_message_or_its_traceback(start_celery_worker):
    """Celery replaces the root logger's handlers with its own unless told: the worker logs through the settings'
    handlers (portal/celery.py), so a task that logs an order's link, and fails with it in its exception, leaves
    the number and not the token in the worker's real output, traceback included."""
    import time

    from portal.celery import app

    worker = start_celery_worker(include=("tests.builders.leaky_tasks",))
    token = "XrkB-tha4GKbFxVoYDk3Tp_nmWdLVRlCAAvy_ugz0D8"
    app.send_task("tests.leak_an_order_link", args=[f"https://book.example.org/orders/BN-ABCD2345/{token}/"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "Traceback" not in "".join(worker.output_tail):
        time.sleep(0.2)
    output = "".join(worker.output_tail)
    assert "sending the order's link https://book.example.org/orders/BN-ABCD2345/[token]/" in output, output[-3000:]
    assert "RuntimeError: could not reach https://book.example.org/orders/BN-ABCD2345/[token]/" in output
    assert "tha4GKbFxVoYDk3Tp" not in output


def test_a_sentry_event_loses_every_token_of_a_link_it_holds_wherever_it_stands():
    from infrastructure.redaction import redact_event

    link = f"/orders/BN-ABCD2345/{TOKEN}/"
    event = {
        "request": {
            "url": f"https://book.example.org{link}",
            "query_string": f"next=%2Forders%2FBN-ABCD2345%2F{TOKEN.replace('-', '%2D')}%2F",
            "headers": {"Referer": f"https://book.example.org{link}events/"},
        },
        "exception": {"values": [{"type": "RuntimeError", "value": f"no order for {TOKEN}"}]},
        "logentry": {"message": "opened %s", "params": [link]},
        "breadcrumbs": {"values": [{"message": f"GET {link}", "data": {link: ("kept", 3, None)}}]},
        "level": "error",
    }

    redacted = redact_event(event, {})

    assert TOKEN not in repr(redacted) and TOKEN.replace("-", "%2D") not in repr(redacted)
    assert redacted["request"]["url"] == "https://book.example.org/orders/BN-ABCD2345/[token]/"
    assert redacted["exception"]["values"][0]["value"] == "no order for [token]"  # seen in a link elsewhere
    assert redacted["breadcrumbs"]["values"][0]["data"] == {"/orders/BN-ABCD2345/[token]/": ("kept", 3, None)}
    assert redacted["level"] == "error"


def test_an_event_without_an_order_link_is_left_as_it_is():
    from infrastructure.redaction import redact_event

    event = {"message": "worker lost", "extra": {"attempt": 3, "ids": [1, 2]}, "tags": {"queue": "chain"}}

    assert redact_event(event) == event
