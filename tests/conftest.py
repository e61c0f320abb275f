"""Shared fixtures. Tests run against the real PostgreSQL and Redis of `make test` (DATABASE_URL, REDIS_URL)."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.cache import cache
from django.test import override_settings

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
from tests.factories import RESEARCH_ANSWERS, make_ssh_key
from tests.processes import process_env_for_tests, stop_process_groups, worker_argv


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


# The tests that use this machine as their GPU host (its sshd, podman, firewall, reserved ports, GPU device nodes) or
# run the production stack in podman share what a machine has one of: under pytest-xdist the files that hold them run
# one after the other on a single worker, the rest of the suite beside them on the other (HostInTurn below). The
# scheduler sees test ids only, not fixtures, so the files are named here, and the collection stops when a test
# uses one of HOST_FIXTURES in another file (tests/portal/test_test_layout.py shows it on planted tests).
HOST_FIXTURES = frozenset({"sshd", "container_sshd", "test_image", "environment_images", "fake_gpus", "outside_server"})
HOST_FILES = frozenset(
    {
        "tests/browser/test_journeys.py",
        "tests/portal/test_compose_stack.py",
        "tests/portal/test_compose_stack_host.py",
        "tests/portal/test_edge_and_deployment.py",
        "tests/provisioning/test_cards.py",
        "tests/provisioning/test_conntrack_flood.py",
        "tests/provisioning/test_container_access.py",
        "tests/provisioning/test_customer_ports.py",
        "tests/provisioning/test_data_continuity.py",
        "tests/provisioning/test_disk_share.py",
        "tests/provisioning/test_drivers.py",
        "tests/provisioning/test_host_checks.py",
        "tests/provisioning/test_host_health.py",
        "tests/provisioning/test_key_removal.py",
        "tests/provisioning/test_provider_fault_host.py",
        "tests/provisioning/test_readings.py",
        "tests/provisioning/test_restarts.py",
        "tests/provisioning/test_share_sizes.py",
        "tests/provisioning/test_shares.py",
        "tests/provisioning/test_ssh_provisioning.py",
        "tests/provisioning/test_teardown.py",
        "tests/provisioning/test_tenant_data_boundary.py",
        "tests/web/console/test_hosts.py",
    }
)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def host_tests_outside_the_host_files(items) -> list[str]:
    """The tests that use the host (one of HOST_FIXTURES, directly or through another fixture) in no HOST_FILES file:
    under two workers they would run beside the host's other tests."""
    return [
        item.nodeid
        for item in items
        if HOST_FIXTURES.intersection(getattr(item, "fixturenames", ())) and _file_of(item.nodeid) not in HOST_FILES
    ]


def pytest_collection_modifyitems(config, items):
    if strays := host_tests_outside_the_host_files(items):
        raise pytest.UsageError(
            "these tests use the GPU host but their files are not in HOST_FILES (tests/conftest.py), so they would run "
            "beside the host's other tests: " + ", ".join(strays)
        )


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's load scheduling (its default), except that the host's files are one unit of work, given to one
    worker whole. (Its own `xdist_group` marks are lost on pytest 9, whose test ids no longer take the group's
    suffix pytest-xdist 3.8 writes into them.)"""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class HostInTurn(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "host" if _file_of(nodeid) in HOST_FILES else nodeid

    return HostInTurn(config, log)


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
    `start_celery_worker(**extra_env)` returns the process, ready; all are stopped after the test."""
    import collections
    import subprocess
    import threading
    import time

    started: list[subprocess.Popen] = []

    def start(**extra_env) -> subprocess.Popen:
        env = process_env_for_tests(**extra_env)
        if not started:
            celery_app.control.purge()  # drop tasks a previous run may have left in the test broker
        process = subprocess.Popen(
            worker_argv("INFO"),
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
