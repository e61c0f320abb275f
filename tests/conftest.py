"""Shared fixtures. Tests run against the real PostgreSQL and Redis of `make test` (DATABASE_URL, REDIS_URL)."""

import os
from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.core.cache import cache
from django.test import override_settings
from django.utils import translation

from booking import selectors
from booking.models import BookingPolicy, OrderStatus
from booking.terms import terms_current, terms_draft_from, terms_publish
from inventory.models import HardwareClass
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from portal.celery import app as celery_app
from provisioning.demo import seed_demo_catalog
from tests.builders.console import act
from tests.builders.orders import place
from tests.builders.production import PRODUCTION_RECORD_KEY
from tests.factories import RESEARCH_ANSWERS, make_ssh_key
from tests.processes import process_env_for_tests, stop_process_groups, worker_argv

# What a deployment sets beside SECRET_KEY: the production processes the tests start inherit it (the tests' own
# process runs in development, with the development key).
os.environ.setdefault("RECORD_SIGNING_KEY", PRODUCTION_RECORD_KEY)


def _this_workers_redis() -> None:
    """`PYTEST_WORKERS=2 make test` runs the suite on two pytest-xdist workers, each with its own test database
    (pytest-django names it after the worker) and its own Redis database: REDIS_URL's for the first, the next one for
    the second. One shared database would let a worker's `cache.clear()` wipe the other's rate-limit counters, and a
    Celery worker started by one take the other's tasks from the broker. Set before anything reads the cache or the
    broker; the processes the tests start (tests/processes.py) are handed the worker's URL."""
    import os
    from urllib.parse import urlsplit, urlunsplit

    from django.conf import settings

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    shared = os.environ.get("REDIS_URL", "")
    if not worker.startswith("gw") or not shared:
        return
    url = urlsplit(shared)
    first = int(url.path.strip("/") or 0)
    own = urlunsplit(url._replace(path=f"/{first + int(worker[2:])}"))
    os.environ["REDIS_URL"] = own
    settings.CACHES["default"]["LOCATION"] = own
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        if getattr(settings, name) == shared:
            setattr(settings, name, own)
            os.environ.pop(name, None)


_this_workers_redis()


# Under pytest-xdist the tests that use this machine as their GPU host run in turn on one worker (tests/scheduling.py).
pytest_plugins = ["tests.scheduling"]


@pytest.fixture(autouse=True, scope="session")
def _cheap_password_hashing():
    """The tests' passwords are fixtures, not secrets: hashed once with a cheap hasher instead of PBKDF2's million
    rounds (a quarter of a second each here, paid for every operator and admin a test creates or logs in). The
    portal's own hashers (portal/settings.py) are untouched; the processes a test starts (the compose stack) use
    theirs."""
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Rate-limit counters and cached values must not leak from one test to the next."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def _default_language():
    """Each test starts in the site's default language: a request the test client made in French leaves French
    active in the thread (LocaleMiddleware activates the request's language and the handler runs in the test's
    thread), and a message a later test reads directly would be in the language the earlier test left."""
    translation.activate(settings.LANGUAGE_CODE)
    yield
    translation.deactivate()


@pytest.fixture(autouse=True)
def _eager_celery(request):
    """Unit tests run tasks in-process; tests marked `integration` use a real worker through the real broker."""
    if request.node.get_closest_marker("integration"):
        yield
        return
    celery_app.conf.task_always_eager = True
    celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager = False


@pytest.fixture
def operator(django_user_model):
    """A staff member with the console's permission."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("olga", password="a-long-operator-password", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="operate_orders"))
    return user


@pytest.fixture
def catalog(db):
    """The demo catalog: B200 (6 lots), H200 (2 lots), MI300X (1 lot), with their prices and environments. Its
    booking policy opens every lot of a class to bookings whose e-mail address is not confirmed: tests book as
    strangers, often a whole class (sold-out answers, races for the last lot). The class-wide share of such holds
    (50 % by default) is tested where it is the subject: tests/booking/test_unconfirmed_share.py and the red team's
    whole-fleet hold, which set the policy's default back."""
    seed_demo_catalog()
    BookingPolicy.objects.filter(pk=1).update(unconfirmed_share_percent=100)
    return {hardware_class.slug: hardware_class for hardware_class in HardwareClass.objects.all()}


@pytest.fixture
def policy(db) -> BookingPolicy:
    return BookingPolicy.current()


@pytest.fixture
def ssh_key() -> str:
    return make_ssh_key()


@pytest.fixture
def start_date(policy):
    """A start date comfortably inside the bookable range."""
    return selectors.earliest_start_date(policy=policy) + timedelta(days=7)


@pytest.fixture
def booking_data(catalog, ssh_key, start_date):
    """Valid POST data for the booking form; tests override one field at a time."""

    def build(**overrides) -> dict:
        data = {
            "hardware_class": "b200-pair",
            "environment": "pytorch-2-7-cuda-12-8",
            "lots": "2",
            "start_date": start_date.isoformat(),
            "days": "7",
            "contact_name": "Ada Lovelace",
            "contact_email": "ada@example.org",
            "organisation": "Analytical Engines Lab",
            "billing_address": "12 rue de la Paix\n75002 Paris",
            "billing_country": "FR",
            "messenger": "@ada:matrix.org",
            "ssh_keys": ssh_key,
            **RESEARCH_ANSWERS,
            "notes": "",
            "accept_terms": "on",
            "terms_version": str(terms_current().pk),
        }
        data.update(overrides)
        return {key: value for key, value in data.items() if value is not None}

    return build


@pytest.fixture
def start_celery_worker(transactional_db):
    """Start real Celery workers (separate processes) on the real broker (Redis) and the test database:
    `start_celery_worker(**extra_env)` returns the process, ready (`include=` modules of tasks of the tests' own);
    all are stopped after the test."""
    import collections
    import subprocess
    import threading
    import time

    started: list[subprocess.Popen] = []

    def start(*, include: tuple[str, ...] = (), **extra_env) -> subprocess.Popen:
        env = process_env_for_tests(**extra_env)
        if not started:
            celery_app.control.purge()  # drop tasks a previous run may have left in the test broker
        process = subprocess.Popen(
            worker_argv("INFO", include),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        started.append(process)
        deadline = time.monotonic() + 60
        lines = []
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            lines.append(line)
            if "ready." in line:
                # Keep reading: a worker whose pipe fills (64 KiB, e.g. the console backend printing an e-mail with
                # an invoice's PDF attached) blocks on its next write, and with it every task.
                process.output_tail = collections.deque(lines, maxlen=500)
                threading.Thread(target=process.output_tail.extend, args=(process.stdout,), daemon=True).start()
                return process
            if process.poll() is not None:
                raise RuntimeError("Celery worker died on start:\n" + "".join(lines))
        process.kill()
        raise RuntimeError("Celery worker not ready in 60 s:\n" + "".join(lines))

    yield start
    stop_process_groups(started)


@pytest.fixture
def celery_worker_process(start_celery_worker):
    """One real Celery worker on every queue."""
    return start_celery_worker()


@pytest.fixture(scope="session")
def anvil():
    """A real EVM node (anvil from npm) with the project's contracts, compiled from source by solc-js."""
    from tests.payments.conftest import deployed_anvil

    with deployed_anvil() as node:
        yield node


@pytest.fixture
def rules(django_capture_on_commit_callbacks):
    """Publish cancellation rules (before booking: an order keeps the rules of the version it accepted)."""

    def publish(*, days: int, fee: str, percent: int):
        draft = terms_draft_from(version=terms_current())
        draft.full_refund_days_before, draft.cancellation_fee, draft.partial_refund_percent = (
            days,
            Decimal(fee),
            percent,
        )
        draft.save()
        with django_capture_on_commit_callbacks(execute=True):
            return terms_publish(version=draft)

    return publish


@pytest.fixture
def paid_order(client, catalog, booking_data, admin_user):
    order, token = place(client, booking_data(lots="2"))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test: paid by wire")
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    return order, token


@pytest.fixture
def ready_order(client, paid_order, operator, django_capture_on_commit_callbacks):
    order, token = paid_order
    client.force_login(operator)
    for action in ("approve", "provision"):
        act(client, order, action, callbacks=django_capture_on_commit_callbacks)
    client.logout()
    order.refresh_from_db()
    assert order.status == OrderStatus.READY
    return order, token
