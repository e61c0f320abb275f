"""Red team, issue 19 ("the edge and the deployment"): what an anonymous visitor and an operator deploying from the
README could do wrong with the portal, each test proving its finding fixed."""

import os
import sys
import warnings

import pytest
from django.core import mail
from django.core.cache.backends.base import CacheKeyWarning
from django.test import Client

from tests.booking.test_pages import place
from tests.portal.test_security import (  # noqa: F401 (production_chains is a fixture)
    NOT_DEMO_XPUB,
    PRODUCTION_SECRET_KEY,
    _production,
    production_chains,
)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/orders/%00/x/",  # the order page
        "/orders/%00/x/events/",  # its event list
        "/orders/%00/x/readings.csv",
        "/orders/%00/x/book-again/",
    ],
)
def test_a_nul_byte_in_an_order_link_is_a_404_not_a_500_mailed_to_the_operators(settings, catalog, path):
    """An order address whose number or token holds a NUL byte (`/orders/%00/x/`), or any character an order
    number or token never has, is a 404 like any unknown order, with no e-mail to ADMINS: the URL converter
    (web/converters.py) refuses it before it reaches PostgreSQL, which refuses NUL in text (a `DataError`, a 500
    mailed to the operators for anyone's one GET). This holds where gunicorn is reached without deploy/nginx.conf's
    nginx (which answers 400 to `%00` itself): another proxy, TRUSTED_PROXY_COUNT=0, `make run`."""
    settings.DEBUG = False
    settings.ADMINS = [("Operators", "ops@example.org")]
    stranger = Client(raise_request_exception=False)
    with warnings.catch_warnings():
        # Production runs without the test suite's warning filters: the key only warns there, then the query fails.
        warnings.simplefilter("ignore", CacheKeyWarning)
        response = stranger.get(path)
    assert response.status_code == 404, response.status_code
    assert not [message for message in mail.outbox if "ops@example.org" in message.to]


@pytest.mark.django_db
def test_a_nul_byte_in_an_invoice_number_is_a_404(settings, client, catalog, booking_data):
    """The invoice PDF address with a NUL in the invoice number is a 404 for the order's holder, not a 500 mailed to
    the operators (PostgreSQL refuses NUL in text): the number's converter excludes control characters."""
    order, token = place(client, booking_data())
    settings.DEBUG = False
    holder = Client(raise_request_exception=False)
    response = holder.get(f"/orders/{order.public_id}/{token}/invoices/%00.pdf")
    assert response.status_code == 404, response.status_code


def test_production_refuses_a_site_url_its_allowed_hosts_do_not_serve(production_chains):  # noqa: F811
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


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["publish", "new_draft"])
def test_a_staff_member_who_may_only_view_the_terms_cannot_publish_or_draft_them(catalog, django_user_model, action):
    """The terms versions' admin actions "Publish the selected draft" (change permission) and "New draft from this
    version" (add permission) are neither offered to nor run for a staff account that may only *view* the terms
    (a bookkeeper, support): the legally binding terms every new order accepts change only with the permission
    the edit form requires."""
    from django.contrib.auth.models import Permission
    from django.urls import reverse

    from booking.models import TermsVersion
    from booking.terms import terms_current, terms_draft_from

    current = terms_current()
    draft = terms_draft_from(version=current)
    viewer = django_user_model.objects.create_user("reader", password="x-reader-password-1", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_termsversion"))
    browser = Client()
    browser.force_login(viewer)
    target = draft if action == "publish" else current
    before = TermsVersion.objects.count()

    response = browser.post(
        reverse("admin:booking_termsversion_changelist"),
        {"action": action, "_selected_action": [str(target.pk)], "index": "0"},
    )

    assert response.status_code in (302, 403)
    draft.refresh_from_db()
    assert draft.number is None, f"a view-only staff member published terms version {draft.number}"
    assert TermsVersion.objects.count() == before, "a view-only staff member made a new terms draft"


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
    `/orders/BN%2DTAES4RBW/<token>/` opens the order: `portal.redaction.redact` recognises the percent-escaped
    spellings of an order link too (the number escaped, a token whose `-` or `_` a link rewriter or mail gateway
    escaped), and no part of the token stays in the redacted line."""
    from portal.redaction import redact

    token = "XrkB-tha4GKbFxVoYDk3Tp_nmWdLVRlCAAvy_ugz0D8"
    line = "GET " + path.format(token=token, encoded=token.replace("-", "%2D")) + " HTTP/1.1"
    logged = redact(line)
    assert "tha4GKbFxVoYDk3Tp" not in logged, logged


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("model", "permission"),
    [
        ("provisioning.operatorsettings", "view_provisioningrun"),
        ("booking.bookingpolicy", "view_order"),
        ("payments.paymentsettings", "view_invoice"),
    ],
)
def test_a_singleton_settings_row_is_added_only_with_the_add_permission(django_user_model, model, permission):
    """While a singleton settings row does not exist yet (a fresh database, until a process first reads it), its
    add form needs the user's add permission: a staff member with another permission in that app (a view-only
    account) gets 403 on the operator settings (auto-approval, wipe delay), the booking policy (holds, caps) and
    the payment settings, and cannot create the row the portal then runs on."""
    from django.apps import apps
    from django.contrib.auth.models import Permission

    app_label, model_name = model.split(".")
    apps.get_model(app_label, model_name).objects.all().delete()
    staff = django_user_model.objects.create_user("viewer", password="x-viewer-password-1", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename=permission, content_type__app_label=app_label))
    browser = Client()
    browser.force_login(staff)

    response = browser.get(f"/admin/{app_label}/{model_name}/add/")

    assert response.status_code == 403, f"a staff member with only {permission} gets {model}'s add form"


DEMO_COMMAND = "docker compose --env-file deploy/demo.env --profile demo up --build"


def test_the_documented_demo_command_passes_the_compose_file_s_own_checks():
    """docs/operations.md ("Running it") and docker-compose.yml's header give one way to try the stack on the demo
    chain, `docker compose --env-file deploy/demo.env --profile demo up --build`, and it is complete: with nothing
    else in the environment, compose resolves it (`config`) in development mode. deploy/demo.env gives every
    variable compose requires (SECRET_KEY, POSTGRES_PASSWORD, REDIS_PASSWORD, PAYMENTS_XPUB, PROVISIONING_SSH_KEY,
    ALLOWED_HOSTS, DEFAULT_FROM_EMAIL, …) public demo values that production refuses."""
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
    assert "DEBUG: '1'" in resolved.stdout


def test_production_refuses_the_development_sender_address(production_chains):  # noqa: F811
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
