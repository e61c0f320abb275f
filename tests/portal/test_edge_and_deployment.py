"""Red team, issue 19 ("the edge and the deployment"): what an operator deploying from the README could do wrong
with the portal and what its logs could leak, each test proving its finding fixed. The team's other findings are
tested with their subject: malformed links in tests/web/test_converters.py, the admin's permissions in
tests/booking/test_admin_permissions.py, unpaid holds from four addresses in tests/booking/test_unconfirmed_share.py."""

import os
import sys

import pytest

from tests.builders.production import NOT_DEMO_XPUB, PRODUCTION_SECRET_KEY, _production


def test_production_refuses_a_site_url_its_allowed_hosts_do_not_serve(production_chains):
    """Production refuses to start (the check bin/web runs fails, naming ALLOWED_HOSTS) on a SITE_URL whose host
    ALLOWED_HOSTS does not serve, such as docker-compose.yml's former default `localhost,127.0.0.1` with
    https://book.example.org: every mailed order link would otherwise answer "400 Bad Request" (DisallowedHost).
    docker-compose.yml now requires ALLOWED_HOSTS, and its header and the README name it."""
    compose_defaults = {
        "SECRET_KEY": PRODUCTION_SECRET_KEY,
        "PAYMENTS_XPUB": NOT_DEMO_XPUB,
        "PAYMENTS_CHAINS_FILE": str(production_chains),
        "ALLOWED_HOSTS": "localhost,127.0.0.1",  # docker-compose.yml: ${ALLOWED_HOSTS:-localhost,127.0.0.1}
        "SITE_URL": "https://book.example.org",
    }
    started = _production("check", "--database", "default", "--fail-level", "ERROR", **compose_defaults)
    if started.returncode != 0:
        assert "ALLOWED_HOSTS" in started.stderr + started.stdout, started.stderr
        return
    # It starts: then a customer opening a mailed link (the SITE_URL's host, through the TLS proxy) must get a page.
    probe = (
        "import django; django.setup()\n"
        "from django.test import Client\n"
        "print(Client(raise_request_exception=False).get('/livez', HTTP_HOST='book.example.org', "
        "HTTP_X_FORWARDED_PROTO='https').status_code)\n"
    )
    answered = _production(
        "-c", probe, command=(sys.executable,), DJANGO_SETTINGS_MODULE="portal.settings", **compose_defaults
    )
    status = answered.stdout.strip().splitlines()[-1] if answered.stdout.strip() else answered.stderr[-500:]
    assert status == "200", f"a mailed link's host is answered {status}"


@pytest.mark.parametrize("path", ["secrets/provisioning_ed25519", "deploy/chains.toml"])
def test_the_documented_places_of_the_key_and_the_chains_file_are_ignored_by_git(path):
    """docker-compose.yml's header tells the operator to keep the provisioning key in ./secrets/ and the chains
    file at ./deploy/chains.toml, inside the checkout: .gitignore ignores both, so the private key to every GPU host
    and the RPC URLs with their API keys never show as untracked files one `git add -A` away from a commit."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=root, check=False)
    assert ignored.returncode == 0, f"{path} is not ignored by git"


@pytest.mark.parametrize(
    "path",
    [
        "/orders/BN%2DTAES4RBW/{token}/",  # the number percent-encoded: the whole token stays in clear
        "/orders/BN-TAES4RBW/{encoded}/",  # the token's own "-" percent-encoded: all but its first piece stays
    ],
)
def test_every_spelling_of_an_order_link_is_redacted_in_the_logs(path):
    """gunicorn's access log writes the raw request line, and Django decodes the path before routing, so
    `/orders/BN%2DTAES4RBW/<token>/` opens the order: `infrastructure.redaction.redact` recognises the percent-escaped
    spellings of an order link too (the number escaped, a token whose `-` or `_` a link rewriter or mail gateway
    escaped), and no part of the token stays in the redacted line."""
    from infrastructure.redaction import redact

    token = "XrkB-tha4GKbFxVoYDk3Tp_nmWdLVRlCAAvy_ugz0D8"
    line = "GET " + path.format(token=token, encoded=token.replace("-", "%2D")) + " HTTP/1.1"
    logged = redact(line)
    assert "tha4GKbFxVoYDk3Tp" not in logged, logged


DEMO_COMMAND = "docker compose --env-file deploy/demo.env --profile demo up --build"


def test_the_documented_demo_command_passes_the_compose_file_s_own_checks():
    """docs/operations.md ("Running it") and docker-compose.yml's header give one way to try the stack on the demo
    chain, `docker compose --env-file deploy/demo.env --profile demo up --build`, and it is complete: with nothing
    else in the environment, compose resolves it (`config`) in development mode. deploy/demo.env gives every
    variable compose requires (SECRET_KEY, POSTGRES_PASSWORD, REDIS_PASSWORD, PAYMENTS_XPUB, PROVISIONING_SSH_KEY,
    ALLOWED_HOSTS, DEFAULT_FROM_EMAIL, …) public demo values that production refuses, and names itself as the
    app's `env_file` (BINOME_ENV_FILE), so that DEBUG=1 and the rest reach the containers."""
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for document in ("docs/operations.md", "docker-compose.yml"):
        text = " ".join((root / document).read_text().replace("#", " ").split())  # lines wrapped, comments joined
        assert DEMO_COMMAND in text, f"{document} does not give the demo command"
    podman_compose = shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")
    arguments = DEMO_COMMAND.split()[2:-2]  # --env-file deploy/demo.env --profile demo
    environment = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
    resolved = subprocess.run(
        [podman_compose, "-f", "docker-compose.yml", *arguments, "config"],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert resolved.returncode == 0, resolved.stderr.strip().splitlines()[-1]
    import yaml

    services = yaml.safe_load(resolved.stdout)["services"]
    for name in ("migrate", "web", "worker", "beat"):  # the app's services read the demo's file too: DEBUG=1
        assert [entry["path"] for entry in services[name]["env_file"]] == ["deploy/demo.env"], name
    assert "DEBUG=1" in (root / "deploy" / "demo.env").read_text().splitlines()


def test_production_refuses_the_development_sender_address(production_chains):
    """Production refuses to start with the development sender `Binôme <bookings@binome.invalid>` (the unset
    default), naming DEFAULT_FROM_EMAIL: `.invalid` never resolves (RFC 2606), so receiving servers that check the
    sender's domain (SPF, DMARC) would refuse or junk every order link, payment and access e-mail, and the error
    reports to ADMINS (SERVER_EMAIL is the same). Reserved domains (.invalid, .example, .test, .localhost) are
    refused as console mail is; docker-compose.yml requires DEFAULT_FROM_EMAIL."""
    started = _production(
        "check",
        "--database",
        "default",
        "--fail-level",
        "ERROR",
        SECRET_KEY=PRODUCTION_SECRET_KEY,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        ALLOWED_HOSTS="book.example.org",
        DEFAULT_FROM_EMAIL=None,  # unset: the default, as docker-compose.yml's own default is the same address
    )
    assert started.returncode != 0, "production started with DEFAULT_FROM_EMAIL=bookings@binome.invalid"
    assert "DEFAULT_FROM_EMAIL" in started.stderr + started.stdout
