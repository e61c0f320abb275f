"""The whole production stack as one, here: docker-compose.yml's own services (PostgreSQL, the broker and cache
Redis servers, the migration, web behind nginx, worker, beat) from its own images, with the deployer's variables,
and a booking made through nginx over HTTPS (the operator's certificate: a local CA's) that the worker turns into
the e-mail with the order link.

Why the host's network: this sandbox's bridges pass no packet between two containers (tests/portal/
test_compose_stack.py), but containers on the host's network reach each other on loopback. So the test hands
podman-compose the compose file with every service moved there, and nothing else changed: the service names
resolve to 127.0.0.1 (extra_hosts), each server listens on a port of its own on 127.0.0.1 (this machine runs its
own PostgreSQL and Redis on the usual ones), and nginx is given those addresses through deploy/proxy's variables.
The e-mail goes to an SMTP server of the test's own (the only outside part).
"""

import json
import re
import secrets
import socketserver
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from http.cookiejar import CookieJar
from pathlib import Path

import pytest
import yaml

from tests.builders.compose import ROOT, Stack, _free_port, prepared_stack
from tests.factories import RESEARCH_ANSWERS

pytestmark = pytest.mark.integration

PROJECT = "binome-stack-host"
ON_LOOPBACK = ("db", "broker", "cache", "web", "mail")


def _on_the_hosts_network(directory: Path, ports: dict[str, int]) -> Path:
    """docker-compose.yml with every service on the host's network, and nothing else of it changed but the ports."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name in ("chain", "chain-setup"):  # the demo profile: not started here
        services.pop(name)
    for name, service in services.items():
        service["network_mode"] = "host"
        service["extra_hosts"] = [f"{host}:127.0.0.1" for host in ON_LOOPBACK]
        service.pop("ports", None)
        service.pop("expose", None)
        if "build" in service:
            service["build"]["context"] = str(ROOT)
        environment = service.get("environment")
        if isinstance(environment, dict) and "DATABASE_URL" in environment:
            for variable in ("DATABASE_URL", "APP_DATABASE_URL"):
                if variable in environment:
                    environment[variable] = environment[variable].replace("@db:5432/", f"@db:{ports['db']}/")
            environment["REDIS_URL"] = environment["REDIS_URL"].replace("@cache:6379/", f"@cache:{ports['cache']}/")
            environment["CELERY_BROKER_URL"] = environment["CELERY_BROKER_URL"].replace(
                "@broker:6379/", f"@broker:{ports['broker']}/"
            )
            environment["HOST"], environment["PORT"] = "127.0.0.1", str(ports["web"])
        if name in ("db", "backup"):
            service["environment"]["PGPORT"] = str(ports["db"])  # the server's, pg_isready's and pg_dump's port
        service["volumes"] = [  # the checkout's files, where the compose file is not
            f"{ROOT}/{volume[2:]}" if volume.startswith("./") else volume for volume in service.get("volumes", [])
        ]
        if name in ("broker", "cache"):
            command = service["command"]
            listen = f"--port {ports[name]} --bind 127.0.0.1"
            command[-1] = command[-1].replace("exec redis-server", f"exec redis-server {listen}")
            test = service["healthcheck"]["test"]
            test[-1] = test[-1].replace("redis-cli ping", f"redis-cli -p {ports[name]} ping")
    # nginx: its listening addresses and gunicorn's, as deploy/proxy takes them (`web` by address: nginx's resolver
    # does not read /etc/hosts, where the service names are here)
    services["proxy"]["environment"].update(
        PROXY_LISTEN_HTTP=f"127.0.0.1:{ports['proxy']}",
        PROXY_LISTEN_HTTPS=f"127.0.0.1:{ports['proxy_tls']}",
        PROXY_UPSTREAM=f"127.0.0.1:{ports['web']}",
    )
    path = directory / "docker-compose.host.yml"
    path.write_text(yaml.safe_dump(compose, sort_keys=False))
    return path


class Mailbox(socketserver.ThreadingTCPServer):
    """An SMTP server of the test's own on 127.0.0.1: what the worker sends lands in `messages`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        self.messages: list[str] = []
        super().__init__(("127.0.0.1", 0), _SmtpSession)


class _SmtpSession(socketserver.StreamRequestHandler):
    def handle(self):
        self.wfile.write(b"220 mailbox ESMTP\r\n")
        while line := self.rfile.readline():
            verb = line.split(b" ")[0].split(b":")[0].strip().upper()
            if verb in (b"EHLO", b"HELO"):
                self.wfile.write(b"250 mailbox\r\n")
            elif verb == b"DATA":
                self.wfile.write(b"354 go on\r\n")
                body = []
                while (data := self.rfile.readline()) not in (b".\r\n", b".\n", b""):
                    body.append(data)
                self.server.messages.append(b"".join(body).decode("utf-8", "replace"))
                self.wfile.write(b"250 queued\r\n")
            elif verb == b"QUIT":
                self.wfile.write(b"221 bye\r\n")
                return
            else:  # MAIL FROM, RCPT TO, RSET, NOOP
                self.wfile.write(b"250 ok\r\n")


@pytest.fixture(scope="module")
def host_stack(tmp_path_factory):
    directory = tmp_path_factory.mktemp("stack-host")
    mailbox = Mailbox()
    threading.Thread(target=mailbox.serve_forever, daemon=True).start()
    ports: dict[str, int] = {}
    while len(set(ports.values())) < 6:  # five servers, six ports
        ports = {name: _free_port() for name in ("db", "broker", "cache", "web", "proxy", "proxy_tls")}
    stack = Stack(directory, project=PROJECT, port=ports["proxy"], tls_port=ports["proxy_tls"])
    stack.compose_files = ["-f", str(_on_the_hosts_network(directory, ports))]
    # beat's scan and sweep every 2 s: /healthz calls them late 36 s after they stop (portal/health.py)
    sooner = {"PAYMENTS_SCAN_SECONDS": "2", "LIFECYCLE_EVERY_SECONDS": "2", "ADMINS": "ops@lab.example.org"}
    email_url = f"smtp://mail:{mailbox.server_address[1]}"
    with prepared_stack(stack, directory, email_url=email_url, settings=sooner, https=True):
        stack.compose("up", "-d", "--no-deps", "db", "broker", "cache")
        for service in ("db", "broker", "cache"):
            stack.healthy(service)
        stack.compose("up", "-d", "--no-deps", "migrate")
        migrated = stack.run("podman", "wait", stack.container("migrate"), timeout=300).stdout.strip()
        assert migrated == "0", stack.logs("migrate")[-3000:]
        stack.compose("up", "-d", "--no-deps", "web", "worker", "beat", "proxy")
        stack.healthy("web")
        yield stack, mailbox
    mailbox.shutdown()


class Browser:
    """A visitor through nginx over HTTPS, trusting only the local CA that signed the proxy's certificate: cookies
    kept, redirects not followed (the test reads them)."""

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    def __init__(self, stack: Stack):
        self.stack = stack
        self.cookies = CookieJar()
        tls = urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(stack.ca)))
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), self._NoRedirect, tls
        )

    def request(self, path: str, data: dict | None = None) -> tuple[int, dict, str]:
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        request = urllib.request.Request(self.stack.url(path), data=body)
        if data is not None:
            request.add_header("Origin", self.stack.site)
            request.add_header("Referer", self.stack.url(path))
        try:
            with self.opener.open(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read().decode()


def _ssh_key(directory: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ada@lab", "-f", str(directory / "id")],
                   check=True)  # fmt: skip
    return (directory / "id.pub").read_text().strip()


def _book(stack: Stack, directory: Path) -> tuple[str, str]:
    """A researcher's booking through nginx, on the operator's catalog (the demo's classes, lots and terms, as they
    would enter them in the admin): (the order page's path, the researcher's e-mail)."""
    seeded = stack.compose(
        "exec", "-T", "web", "python", "manage.py", "shell", "-c",
        "from provisioning.demo import seed_demo_catalog; print(seed_demo_catalog())",
    )  # fmt: skip
    assert "lots" in seeded.stdout, seeded.stdout + seeded.stderr
    browser = Browser(stack)
    status, _headers, page = browser.request("/")
    assert status == 200 and "csrfmiddlewaretoken" in page, page[-2000:]
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[1]
    terms = re.search(r'name="terms_version" value="(\d+)"', page)[1]
    start = (datetime.now(UTC) + timedelta(days=9)).date().isoformat()
    email = f"ada-{secrets.token_hex(4)}@lab.example.org"
    status, headers, page = browser.request(
        "/",
        {
            "csrfmiddlewaretoken": token, "hardware_class": "b200-pair", "environment": "pytorch-2-7-cuda-12-8",
            "lots": "1", "start_date": start, "days": "7", "contact_name": "Ada Lovelace", "contact_email": email,
            "organisation": "Analytical Engines Lab", "billing_address": "12 rue de la Paix\n75002 Paris",
            "billing_country": "FR", "messenger": "", "ssh_keys": _ssh_key(directory), **RESEARCH_ANSWERS,
            "notes": "", "accept_terms": "on", "terms_version": terms,
        },
    )  # fmt: skip
    assert status == 302, re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))[-2000:] + stack.logs("web")[-4000:]
    return urllib.parse.urlsplit(headers["Location"]).path, email


def test_a_booking_made_through_nginx_lands_and_the_worker_mails_its_link(host_stack, tmp_path):
    stack, mailbox = host_stack
    # when: a researcher opens the booking page through nginx and books, on the operator's catalog
    order_path, email = _book(stack, tmp_path)

    # then: the booking lands (its order page, through nginx, says so) ...
    status, _headers, page = Browser(stack).request(order_path)
    assert status == 200 and "Awaiting payment" in page

    # ... and the worker, over the broker, sends the order link to the researcher's address
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not any(email in message for message in mailbox.messages):
        time.sleep(1)
    mailed = [message for message in mailbox.messages if email in message]
    assert mailed, f"no e-mail to {email}; worker said:\n{stack.logs('worker')[-3000:]}"
    assert f"{stack.site}{order_path.rsplit('/', 2)[0]}" in mailed[0].replace("=\n", "")

    # and: beat's schedule reaches the worker too (the chain scan runs, finding the unreachable node unavailable)
    # (every PAYMENTS_SCAN_SECONDS, 10 s in production, the first one period after beat starts)
    scanned = r"Task payments\.scan_chain\[[0-9a-f-]+\] succeeded"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not re.search(scanned, stack.logs("worker")):
        time.sleep(2)
    assert re.search(scanned, stack.logs("worker")), stack.logs("beat")[-2000:] + stack.logs("worker")[-2000:]


def test_nginx_serves_https_with_the_operator_s_certificate_and_the_web_process_cannot_read_the_ssh_key(host_stack):
    stack, _mailbox = host_stack
    status, headers, _page = Browser(stack).request("/livez")
    assert status == 200 and "nginx" in headers.get("Server", "")
    assert headers["Strict-Transport-Security"].startswith("max-age=31536000")  # the portal saw https
    # the operator's check of docs/operations.md ("HTTPS"), trusting only their CA
    checked = stack.run(
        "curl", "-sS", "--cacert", str(stack.ca), "-o", "/dev/null", "-w", "%{http_code}",
        "--resolve", f"localhost:{stack.tls_port}:127.0.0.1", stack.url("/livez"),
    )  # fmt: skip
    assert checked.stdout == "200"
    # plain http sends the visitor to the same page over HTTPS
    plain = stack.run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{redirect_url}",
                      "-H", "Host: localhost", f"http://127.0.0.1:{stack.port}/book/?lots=2")  # fmt: skip
    assert plain.stdout == f"308 {stack.site}/book/?lots=2"
    key = stack.compose("exec", "-T", "web", "test", "-e", "/run/secrets/provisioning_ssh_key", check=False)
    assert key.returncode != 0
    assert stack.compose("exec", "-T", "worker", "test", "-r", "/run/secrets/provisioning_ssh_key").returncode == 0


def _as_owner(stack: Stack, statement: str) -> None:
    stack.compose("exec", "-T", "db", "psql", "-U", "binome", "-d", "binome", "-v", "ON_ERROR_STOP=1", "-c", statement)


def test_a_request_that_fails_is_mailed_to_admins_without_the_order_s_token(host_stack, tmp_path):
    stack, mailbox = host_stack
    order_path, _email = _book(stack, tmp_path)
    token = order_path.strip("/").split("/")[2]
    # given: the app's role can no longer read the orders (a grant lost by hand): the order page fails
    _as_owner(stack, "REVOKE SELECT ON booking_order FROM binome_app")
    try:
        # when: the researcher opens their order page
        status, _headers, page = Browser(stack).request(order_path)

        # then: an error page, and the operators' address receives the error report, the link's token redacted
        assert status == 500 and token not in page
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (reports := [m for m in mailbox.messages if "[Django] ERROR" in m]):
            time.sleep(1)
        assert reports, f"no error report mailed; web said:\n{stack.logs('web')[-3000:]}"
        report = reports[-1].replace("=\n", "")
        assert "To: ops@lab.example.org" in report and "permission denied for table booking_order" in report
        assert f"{order_path.rsplit('/', 2)[0]}/[token]/" in report and token not in report
    finally:
        _as_owner(stack, "GRANT SELECT ON booking_order TO binome_app")


DDL_ATTEMPT = """
from django.db import connection
for statement in (
    "ALTER TABLE payments_fiscalinvoice ADD COLUMN planted integer",
    "DROP TRIGGER payments_fiscal_invoice_immutable ON payments_fiscalinvoice",
):
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement)
        print("ALLOWED", statement)
    except Exception as error:
        print("REFUSED", type(error).__name__, str(error).splitlines()[0])
"""


def test_the_app_s_processes_cannot_alter_a_table_nor_drop_the_invoice_trigger(host_stack):
    stack, _mailbox = host_stack
    for service in ("web", "worker"):
        said = stack.compose("exec", "-T", service, "python", "manage.py", "shell", "-c", DDL_ATTEMPT).stdout
        assert said.count("REFUSED ProgrammingError must be owner") == 2 and "ALLOWED" not in said, (service, said)
    owner = stack.compose("exec", "-T", "db", "psql", "-U", "binome", "-d", "binome", "-tAc",
                          "select tableowner from pg_tables where tablename = 'payments_fiscalinvoice'")  # fmt: skip
    assert owner.stdout.strip() == "binome"


HEALTH = """
import json, os, urllib.request
print(urllib.request.urlopen("http://127.0.0.1:" + os.environ["PORT"] + "/healthz", timeout=10).read().decode())
"""


def _schedule(stack: Stack) -> dict:
    """What /healthz says of beat's watched tasks, asked as a probe on the web container's loopback."""
    said = stack.compose("exec", "-T", "web", "python", "-c", HEALTH).stdout
    return json.loads(said)["schedule"]


def _until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(3)
    return condition()


def test_healthz_and_beat_s_healthcheck_say_when_beat_has_stopped(host_stack):
    stack, _mailbox = host_stack
    beat_check = ["podman", "healthcheck", "run", stack.container("beat")]
    assert _until(lambda: _schedule(stack)["ok"], 60), _schedule(stack)
    assert stack.run(*beat_check, check=False).returncode == 0
    assert stack.run("podman", "healthcheck", "run", stack.container("worker"), check=False).returncode == 0

    stack.compose("stop", "-t", "5", "beat")
    try:
        # each task turns late at its own pace (scan_chains every 2 s first): both are said, once both are late
        both = ("payments.scan_chains last ran", "provisioning.lifecycle_tick last ran")
        assert _until(lambda: all(name in _schedule(stack)["detail"] for name in both), 90), _schedule(stack)
        assert not _schedule(stack)["ok"]
        assert Browser(stack).request("/healthz")[0] == 200  # the pages are served all the same
        # beat's healthcheck command says it too (run in web: beat's own container is stopped)
        checked = stack.compose("exec", "-T", "web", "python", "manage.py", "check_schedule", check=False)
        assert checked.returncode != 0 and "late: payments.scan_chains last ran" in checked.stderr
        stack.compose("start", "beat")
        assert _until(lambda: _schedule(stack)["ok"], 60)
        assert _until(lambda: stack.run(*beat_check, check=False).returncode == 0, 30)
    finally:
        stack.compose("start", "beat", check=False)


MARK_PAID = """
from django.contrib.auth import get_user_model
from django.db import transaction
from payments.models import Invoice
from payments.settlement import invoice_mark_paid
user, _ = get_user_model().objects.get_or_create(username="drill", defaults={"is_staff": True})
with transaction.atomic():
    invoice_mark_paid(invoice=Invoice.objects.get(order__public_id="%s"), user=user, reason="paid by bank transfer")
"""
PDFS = "select number, encode(sha256(pdf), 'hex') from payments_fiscalinvoice where pdf_sha256 <> '' order by 1"


def _invoice_pdfs(stack: Stack) -> list[str]:
    """Each fiscal invoice with its PDF, and the PDF's SHA-256 as PostgreSQL computes it from the stored bytes."""
    listed = stack.compose("exec", "-T", "db", "psql", "-U", "binome", "-d", "binome", "-tAc", PDFS)
    return listed.stdout.split()


def test_a_backup_restored_into_an_empty_stack_gives_back_the_invoices_pdfs_byte_for_byte(host_stack, tmp_path):
    stack, _mailbox = host_stack
    # given: a paid order (marked paid by an admin), whose fiscal invoice's PDF the worker wrote
    order_path, _email = _book(stack, tmp_path)
    number = order_path.strip("/").split("/")[1]
    stack.compose("exec", "-T", "web", "python", "manage.py", "shell", "-c", MARK_PAID % number)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (pdfs := _invoice_pdfs(stack)):
        time.sleep(2)
    assert pdfs, f"no invoice PDF written; worker said:\n{stack.logs('worker')[-3000:]}"

    # when: a backup is taken, the stack is destroyed with its volumes, and the backup restored into a new one
    taken = stack.compose("run", "--rm", "--no-deps", "backup", "once").stdout
    (dump,) = (stack.directory / "backups").glob("binome-*.dump")
    assert f"backup: /backups/{dump.name}" in taken and dump.stat().st_mode & 0o777 == 0o600
    stack.compose("down", "-v", "-t", "5")
    assert not _volume_exists(stack, "postgres-data")
    restore = [str(ROOT / "bin" / "restore"), str(dump)]
    environment = {**stack.env, "COMPOSE": " ".join(stack.compose_command())}
    restored = subprocess.run(restore, env=environment, capture_output=True, text=True, timeout=600, check=False)
    assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-3000:]
    stack.compose("up", "-d", "--no-deps", "broker", "cache")
    for service in ("broker", "cache"):
        stack.healthy(service)
    stack.compose("up", "-d", "--no-deps", "web", "worker", "beat", "proxy")
    stack.healthy("web")

    # then: every invoice's PDF is back unchanged, the researcher's page opens, and the app's role writes again
    assert _invoice_pdfs(stack) == pdfs
    status, _headers, page = Browser(stack).request(order_path)
    assert status == 200 and number in page
    (tmp_path / "again").mkdir()
    assert _book(stack, tmp_path / "again")[0] != order_path

    # and: a second restore over the restored database is refused, nothing changed
    again = subprocess.run(restore, env=environment, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 1 and "already has" in again.stderr
    assert _invoice_pdfs(stack) == pdfs


def _volume_exists(stack: Stack, name: str) -> bool:
    return stack.run("podman", "volume", "exists", f"{stack.project}_{name}", check=False).returncode == 0
