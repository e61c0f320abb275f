"""The production stack, built and started here from its own files (issue 19): the images docker-compose.yml runs,
built from Debian packages (bin/stack-images; no registry is reachable), the app's image from the Dockerfile with
secrets planted in its build context, and the compose file's services brought up by podman-compose with the
variables a deployer gives: PostgreSQL and the two Redis servers pass their own healthchecks with their passwords,
the app's processes accept the production settings with the secrets mounted as the file says, only the worker is
given the SSH key, and the image holds none of the planted secrets.

On this sandbox's bridges no packet passes between two containers (its kernel passes none between two containers
of one bridge, none from a container to the host, and aardvark-dns, podman's name server, never answers), so here
the services run on their compose networks apart, and tests/portal/test_compose_stack_host.py runs them as one on
the host's network: a booking through nginx, the worker's e-mail, beat's schedule. podman 4.3 also ignores
`condition: service_healthy` and runs healthchecks from systemd timers, which this sandbox lacks: the tests run
each service's own healthcheck (`podman healthcheck run`) until it passes.
The build sees the host's certificate store (this network's TLS proxy signs PyPI's certificates), and podman's file
limit is lowered for every container (runc cannot raise it here): both are this machine's, not the stack's.
"""

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.portal.test_security import NOT_DEMO_XPUB, PRODUCTION_CHAINS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "binome-stack-test"
APP_IMAGE = "localhost/binome:latest"  # docker-compose.yml's `image: binome:latest`, as podman names it
PLANTED = "PLANTED-SECRET-" + secrets.token_hex(8)


def _free_port() -> int:
    """A port nothing listens on, below Linux's ephemeral ports (32768): between this look and the server's start
    (a minute, with the build) no outgoing connection of this machine's can take it."""
    for _ in range(200):
        port = 29000 + secrets.randbelow(3700)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 29000-32699")


class Stack:
    def __init__(self, directory: Path, *, project: str = PROJECT, port: int | None = None):
        self.directory = directory
        self.project = project
        self.port = port or _free_port()
        conf = directory / "containers.conf"
        conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.compose_files = ["-f", str(ROOT / "docker-compose.yml")]

    def run(self, *argv: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv[:8])}… exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def compose(self, *argv: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        podman_compose = shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")
        return self.run(podman_compose, "-p", self.project, *self.compose_files, *argv, timeout=timeout, check=check)

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def healthy(self, service: str, deadline_s: float = 180) -> None:
        """The compose file's healthcheck of `service`, run until it passes (what systemd's timer would do)."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.run("podman", "healthcheck", "run", self.container(service), check=False).returncode == 0:
                return
            time.sleep(2)
        logs = self.run("podman", "logs", "--tail", "40", self.container(service), check=False)
        raise AssertionError(f"{service} never became healthy:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")

    def logs(self, service: str) -> str:
        result = self.run("podman", "logs", self.container(service), check=False)
        return result.stdout + result.stderr

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _build_context(directory: Path) -> Path:
    """The project as a deployer's checkout has it (tracked and untracked files git does not ignore), with the
    secrets the documentation tells them to keep next to it: the provisioning key, a .env and a chains file."""
    context = directory / "context"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            target = context / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (context / "secrets").mkdir(exist_ok=True)
    (context / "secrets" / "provisioning_ed25519").write_text(f"{PLANTED}-key\n")
    (context / ".env").write_text(f"SECRET_KEY={PLANTED}-env\n")
    (context / "deploy" / "chains.toml").write_text(f'# {PLANTED}-chains\nrpc_urls = ["https://x/{PLANTED}"]\n')
    return context


@contextmanager
def prepared_stack(stack: Stack, directory: Path, *, email_url: str = "smtp://mail:1025") -> Iterator[Stack]:
    """The compose file's images built (the app's from a deployer's checkout with secrets planted in it), the
    secrets and variables a deployer gives; the stack taken down, with its volumes, before and after."""
    images = dict(
        line.split("=", 1) for line in stack.run(str(ROOT / "bin" / "stack-images"), timeout=1200).stdout.split()
    )
    context = _build_context(directory)
    stack.run(
        "podman", "build", "--build-arg", f"BASE_IMAGE={images['BASE_IMAGE']}",
        "--volume", "/etc/ssl/certs:/etc/ssl/certs:ro", "--tag", APP_IMAGE, str(context), timeout=1500,
    )  # fmt: skip
    uid = stack.run("podman", "run", "--rm", APP_IMAGE, "id", "-u").stdout.strip()
    key = directory / "provisioning_ed25519"
    key.write_text(f"{PLANTED}-mounted-key\n")
    os.chown(key, int(uid), int(uid))
    key.chmod(0o400)
    chains = directory / "chains.toml"
    chains.write_text(PRODUCTION_CHAINS)
    chains.chmod(0o644)
    stack.env.update(
        images,
        SECRET_KEY=secrets.token_urlsafe(64),
        POSTGRES_PASSWORD=secrets.token_urlsafe(16),
        REDIS_PASSWORD=secrets.token_urlsafe(16),
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        CHAINS_FILE=str(chains),
        PROVISIONING_SSH_KEY=str(key),
        # A lab's portal on its own network, without TLS (docs/operations.md, "Site address and e-mail").
        SITE_URL=f"http://localhost:{stack.port}",
        SITE_URL_PRIVATE_NETWORK="1",
        SECURE_SSL_REDIRECT="0",
        ALLOWED_HOSTS="localhost,127.0.0.1",
        CSRF_TRUSTED_ORIGINS=f"http://127.0.0.1:{stack.port},http://localhost:{stack.port}",
        EMAIL_URL=email_url,
        DEFAULT_FROM_EMAIL="Binôme <bookings@binome.lab.internal>",
        PROXY_PORT=str(stack.port),
    )
    stack.compose("down", "-v", "-t", "2", check=False)
    try:
        yield stack
    finally:
        stack.compose("down", "-v", "-t", "2", check=False)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    directory = tmp_path_factory.mktemp("stack")
    with prepared_stack(Stack(directory), directory) as stack:
        stack.compose("up", "-d", "--no-deps", "db", "broker", "cache")
        for service in ("db", "broker", "cache"):
            stack.healthy(service)
        yield stack


def _in(stack: Stack, service: str, *argv: str) -> subprocess.CompletedProcess:
    return stack.run("podman", "exec", stack.container(service), *argv, check=False)


def test_postgres_and_both_redis_servers_start_healthy_and_refuse_a_client_without_the_password(stack):
    password = stack.env["POSTGRES_PASSWORD"]
    select = ["psql", "-h", "127.0.0.1", "-U", "binome", "-d", "binome", "-tAc", "select current_user"]
    assert _in(stack, "db", "env", f"PGPASSWORD={password}", *select).stdout.strip() == "binome"
    assert _in(stack, "db", "env", "PGPASSWORD=wrong", *select).returncode != 0
    for service in ("broker", "cache"):
        assert "NOAUTH" in _in(stack, service, "redis-cli", "ping").stdout
    auth = ["env", f"REDISCLI_AUTH={stack.env['REDIS_PASSWORD']}", "redis-cli", "config", "get"]
    broker = _in(stack, "broker", *auth, "*").stdout.split()
    cache = _in(stack, "cache", *auth, "*").stdout.split()
    setting = lambda listed, name: listed[listed.index(name) + 1]  # noqa: E731
    # the broker keeps queued tasks (on disk, never evicted); the cache is bounded and evicts, nothing on disk
    assert (setting(broker, "appendonly"), setting(broker, "maxmemory-policy")) == ("yes", "noeviction")
    assert (setting(cache, "appendonly"), setting(cache, "maxmemory-policy")) == ("no", "allkeys-lru")
    assert setting(cache, "maxmemory") == str(256 * 2**20)


def test_the_app_accepts_the_production_settings_and_only_the_worker_is_given_the_ssh_key(stack):
    def run(service: str, command: str) -> subprocess.CompletedProcess:
        return stack.compose("run", "--rm", "-T", "--no-deps", service, "sh", "-c", command, check=False)

    checked = run("web", "python manage.py check --deploy --fail-level ERROR")
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    assert run("worker", "test -r /run/secrets/provisioning_ssh_key && test -r /run/secrets/chains").returncode == 0
    assert run("web", "test -e /run/secrets/provisioning_ssh_key").returncode != 0
    assert run("beat", "test -e /run/secrets/provisioning_ssh_key").returncode != 0
    assert run("web", "ls /run/secrets").stdout.split() == ["chains"]


def test_the_image_holds_no_secret_of_its_build_context(stack):
    found = stack.run(
        "podman", "run", "--rm", APP_IMAGE, "sh", "-c",
        f"ls -A /app; grep -rl {PLANTED} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 2>/dev/null; true",
    ).stdout.split()  # fmt: skip
    assert PLANTED not in " ".join(found) and not [path for path in found if path.startswith("/")], found
    assert {".env", "secrets", "deploy", ".git", "tests", "node_modules"}.isdisjoint(found)
    assert {"manage.py", "portal", "staticfiles", "templates"} <= set(found)
