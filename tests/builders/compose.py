"""The compose stack as the deployment tests run it: a project name, free ports, the built context, a planted secret."""

import base64
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.builders.production import NOT_DEMO_XPUB, PRODUCTION_CHAINS
from tests.builders.tls import local_ca

ROOT = Path(__file__).resolve().parents[2]


PROJECT = "binome-stack-test"


APP_IMAGE = "localhost/binome:latest"  # docker-compose.yml's `image: binome:latest`, as podman names it


PLANTED = "PLANTED-SECRET-" + secrets.token_hex(8)


EXAMPLE = ROOT / "deploy" / "production.env.example"


def example_settings() -> dict[str, str]:
    """deploy/production.env.example's optional settings (its commented `# NAME=value` lines), as written there."""
    return dict(re.findall(r"^# ([A-Z][A-Z0-9_]{2,})=(.*)$", EXAMPLE.read_text(), flags=re.M))


def _deployers_shell() -> dict[str, str]:
    """This process's environment without the portal's settings (the tests' DEBUG=1, their database and Redis):
    a deployer's shell gives compose only what deploy/production.env holds."""
    named = set(re.findall(r"\b[A-Z][A-Z0-9_]{2,}\b", EXAMPLE.read_text()))
    return {name: value for name, value in os.environ.items() if name not in named and not name.startswith("TEST_")}


def env_file_text(values: dict[str, str]) -> str:
    """An env file compose and its services read alike: every value double-quoted, `\\` and `"` escaped."""
    quoted = (value.replace("\\", "\\\\").replace('"', '\\"') for value in values.values())
    return "".join(f'{name}="{value}"\n' for name, value in zip(values, quoted, strict=True))


def podman_compose() -> str:
    return shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")


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
    def __init__(
        self, directory: Path, *, project: str = PROJECT, port: int | None = None, tls_port: int | None = None
    ):
        self.directory = directory
        self.project = project
        self.port = port or _free_port()  # the proxy's plain http (PROXY_PORT)
        self.tls_port = tls_port or _free_port()  # its HTTPS (PROXY_TLS_PORT)
        self.ca: Path | None = None  # the CA that signed the proxy's certificate, when it serves HTTPS
        conf = directory / "containers.conf"
        conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
        self.env = {**_deployers_shell(), "CONTAINERS_CONF": str(conf)}
        self.compose_files = ["-f", str(ROOT / "docker-compose.yml")]
        self.env_file = directory / "production.env"  # the deployer's deploy/production.env

    def run(self, *argv: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv[:8])}… exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def compose_command(self) -> list[str]:
        """What `docker compose --env-file deploy/production.env` is for this stack."""
        return [podman_compose(), "-p", self.project, *self.compose_files, "--env-file", str(self.env_file)]

    def compose(self, *argv: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(*self.compose_command(), *argv, timeout=timeout, check=check)

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

    @property
    def site(self) -> str:
        """Where a visitor reaches the portal: SITE_URL."""
        return self.settings["SITE_URL"]

    def url(self, path: str) -> str:
        return self.site + path


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
def prepared_stack(
    stack: Stack,
    directory: Path,
    *,
    email_url: str = "smtp://mail:1025",
    settings: dict[str, str] | None = None,
    https: bool = False,
) -> Iterator[Stack]:
    """The compose file's images built (the app's from a deployer's checkout with secrets planted in it), the
    secrets a deployer gives and their deploy/production.env (the required values, then `settings`), given to
    compose as the documentation says; the stack taken down, with its volumes, before and after. `https`: the proxy
    serves the portal over HTTPS with a certificate of a local CA (`stack.ca`) for localhost, in TLS_DIR; else on
    plain http, as a lab on its own network may (PROXY_PLAIN_HTTP=1)."""
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
    stack.env["BINOME_ENV_FILE"] = str(stack.env_file)
    required = dict(
        images,
        SECRET_KEY=secrets.token_urlsafe(64),
        RECORD_SIGNING_KEY=base64.b64encode(secrets.token_bytes(32)).decode(),
        POSTGRES_PASSWORD=secrets.token_urlsafe(16),
        POSTGRES_APP_PASSWORD=secrets.token_urlsafe(16),
        REDIS_PASSWORD=secrets.token_urlsafe(16),
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        CHAINS_FILE=str(chains),
        PROVISIONING_SSH_KEY=str(key),
        # A lab's portal on its own network (docs/operations.md, "Site address and e-mail"): localhost.
        SITE_URL_PRIVATE_NETWORK="1",
        ALLOWED_HOSTS="localhost,127.0.0.1",
        EMAIL_URL=email_url,
        DEFAULT_FROM_EMAIL="Binôme <bookings@binome.lab.internal>",
        PROXY_PORT=str(stack.port),
        PROXY_TLS_PORT=str(stack.tls_port),
        BACKUP_DIR=str(directory / "backups"),
    )
    (directory / "acme").mkdir(exist_ok=True)
    required["ACME_DIR"] = str(directory / "acme")
    if https:
        stack.ca = local_ca(directory)
        site = f"https://localhost:{stack.tls_port}"
        required.update(SITE_URL=site, CSRF_TRUSTED_ORIGINS=site, TLS_DIR=str(directory / "tls"))
    else:
        (directory / "no-certificate").mkdir(exist_ok=True)
        site = f"http://localhost:{stack.port}"
        required.update(SITE_URL=site, CSRF_TRUSTED_ORIGINS=site, TLS_DIR=str(directory / "no-certificate"))
        required.update(PROXY_PLAIN_HTTP="1", SECURE_SSL_REDIRECT="0")
    (directory / "backups").mkdir(exist_ok=True)
    stack.settings = {**(settings or {}), **required}
    stack.env_file.write_text(env_file_text(stack.settings))
    stack.env_file.chmod(0o600)
    stack.compose("down", "-v", "-t", "2", check=False)
    try:
        yield stack
    finally:
        stack.compose("down", "-v", "-t", "2", check=False)
