"""Security as users and attackers meet it: headers, CSRF on every state-changing request, who may reach what,
and production settings that refuse unsafe defaults."""

import os
import re
import sys
from pathlib import Path

import pytest
from csp.decorators import csp_exempt, csp_update
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.http import HttpResponse
from django.test import Client
from django.urls import reverse

from booking.models import Order, OrderStatus
from payments.models import Invoice
from portal.middleware import ContentSecurityPolicyMiddleware
from tests.builders.orders import place
from tests.builders.production import NOT_DEMO_XPUB, PRODUCTION_CHAINS, PRODUCTION_SECRET_KEY, ROOT, _production


@pytest.mark.django_db
def test_customer_pages_carry_a_strict_content_security_policy_and_no_inline_script(client, catalog, booking_data):
    order, token = place(client, booking_data())
    pages = [
        reverse("customer:book"),
        reverse("customer:guide"),
        reverse("customer:fit"),
        reverse("customer:resend-link"),
        reverse("customer:order", kwargs={"public_id": order.public_id, "token": token}),
    ]
    for url in pages:
        response = client.get(url)
        policy = response["Content-Security-Policy"]
        directives = _directives(policy)  # django-csp writes them in no fixed order
        assert directives["script-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
        assert "unsafe-inline" not in policy
        assert response["X-Frame-Options"] == "DENY" and response["X-Content-Type-Options"] == "nosniff"
        inline = re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", response.content.decode())
        assert inline == [], (url, inline)
        handlers = re.findall(r"<[a-zA-Z][^>]*\son[a-z]+=", response.content.decode())
        assert handlers == [], (url, handlers)  # no inline event handler either


POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "connect-src": "'self'",
    "font-src": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
    "base-uri": "'none'",
    "object-src": "'none'",
}


def _directives(header: str) -> dict[str, str]:
    return dict(part.strip().split(" ", 1) for part in header.split(";") if part.strip())


@pytest.mark.django_db
def test_the_policy_is_the_same_everywhere_with_inline_styles_on_the_admin_only(client, catalog, admin_user):
    static = client.get("/static/css/portal.css")
    page = client.get(reverse("customer:book"))
    client.force_login(admin_user)
    admin = client.get(reverse("admin:index"))

    assert _directives(page["Content-Security-Policy"]) == POLICY
    assert _directives(static["Content-Security-Policy"]) == POLICY
    assert _directives(admin["Content-Security-Policy"]) == {**POLICY, "style-src": "'self' 'unsafe-inline'"}
    for response in (page, static, admin):
        assert response["Permissions-Policy"] == "camera=(), microphone=(), geolocation=(), payment=(), usb=()"


def test_the_policy_follows_the_settings(client, settings):
    """django-csp builds the header from the settings it finds (portal.middleware adds nothing outside /admin/)."""
    assert _directives(client.get("/livez")["Content-Security-Policy"]) == POLICY

    settings.CONTENT_SECURITY_POLICY = {"DIRECTIVES": {**POLICY, "img-src": ["'self'"]}}
    assert _directives(client.get("/livez")["Content-Security-Policy"]) == {**POLICY, "img-src": "'self'"}
    settings.CONTENT_SECURITY_POLICY_REPORT_ONLY = {"DIRECTIVES": {"default-src": ["'none'"]}}
    assert client.get("/livez")["Content-Security-Policy-Report-Only"] == "default-src 'none'"


def test_a_response_with_a_policy_of_its_own_gets_it_from_django_csp(rf):
    """What django-csp's public decorators say of one view is honoured, on the admin too (where the view's own
    update of style-src wins over the admin's), and exempt views get no header."""

    @csp_update({"img-src": ["https://images.example.org"]})
    def own_images(request):
        return HttpResponse("ok")

    @csp_update({"style-src": ["https://styles.example.org"]})
    def own_styles(request):
        return HttpResponse("ok")

    @csp_exempt()
    def exempt(request):
        return HttpResponse("ok")

    header = ContentSecurityPolicyMiddleware(own_images)(rf.get("/livez"))["Content-Security-Policy"]
    assert _directives(header) == {**POLICY, "img-src": "'self' data: https://images.example.org"}
    admin = ContentSecurityPolicyMiddleware(own_images)(rf.get("/admin/"))["Content-Security-Policy"]
    assert _directives(admin) == {
        **POLICY,
        "img-src": "'self' data: https://images.example.org",
        "style-src": "'self' 'unsafe-inline'",
    }
    styled = ContentSecurityPolicyMiddleware(own_styles)(rf.get("/admin/"))["Content-Security-Policy"]
    assert _directives(styled)["style-src"] == "'self' https://styles.example.org"
    assert "Content-Security-Policy" not in ContentSecurityPolicyMiddleware(exempt)(rf.get("/livez"))
    plain = ContentSecurityPolicyMiddleware(lambda request: HttpResponse("ok"))(rf.get("/livez"))
    assert _directives(plain["Content-Security-Policy"]) == POLICY


def _role_clients(django_user_model) -> dict[str, Client]:
    clients = {"anonymous": Client()}
    staff = django_user_model.objects.create_user("sam", password="a-long-staff-password", is_staff=True)
    operator = django_user_model.objects.create_user("olga", password="a-long-operator-password", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="operate_orders"))
    admin = django_user_model.objects.create_superuser("ada", "ada@example.org", "a-long-admin-password")
    for name, user in (("staff", staff), ("operator", operator), ("admin", admin)):
        clients[name] = Client()
        clients[name].force_login(user)
    return clients


CONSOLE_ACTIONS = ["approve", "reject", "retry", "preflight", "teardown", "provision", "reassign", "extend", "cancel"]
ADMIN_CHANGELISTS = [
    "inventory_hardwareclass",
    "inventory_lot",
    "booking_order",
    "booking_orderevent",
    "payments_invoice",
    "payments_transfer",
    "payments_operatorrate",
    "payments_chaincursor",
    "inventory_host",
    "provisioning_provisioningrun",
    "provisioning_access",
]


@pytest.mark.django_db
def test_the_permission_matrix(client, catalog, booking_data, django_user_model):
    """Every URL and action × anonymous, the researcher (their link, no account), staff without the operator
    permission, operator, admin; a wrong link for each of them. Each cell is asserted; nothing moves."""
    order, token = place(client, booking_data())
    clients = _role_clients(django_user_model)
    clients["researcher"] = client  # the browser that placed the order: a session, no account
    right = {"public_id": order.public_id, "token": token}
    wrong = {"public_id": order.public_id, "token": "w" * 43}
    at_login = "/admin/login/"

    def answer(role: str, method: str, url: str, data: dict | None = None) -> tuple[int, str]:
        response = getattr(clients[role], method)(url, data or {})
        return response.status_code, response.get("Location", "")

    # Public pages, and the order pages: the secret link is the only key, whoever holds it.
    public = ["customer:book", "customer:guide", "customer:fit", "customer:split-trial-kit", "customer:resend-link"]
    for role in clients:
        for name in public:
            assert answer(role, "get", reverse(name))[0] == 200, (role, name)
        assert answer(role, "get", reverse("customer:order", kwargs=right))[0] == 200, role
        assert answer(role, "get", reverse("customer:order", kwargs=wrong))[0] == 404, role
        for name in ("order-cancel", "order-paid", "order-asset", "order-split-trial"):
            assert answer(role, "post", reverse(f"customer:{name}", kwargs=wrong))[0] == 404, (role, name)

    # The console: operators and admins only; the others are sent to log in (no account) or refused (staff).
    console_pages = [
        reverse("console:queue"),
        reverse("console:calendar"),
        reverse("console:order", kwargs={"public_id": order.public_id}),
    ]
    console_order = console_pages[2]
    for url in console_pages:
        for role in ("anonymous", "researcher"):
            status, location = answer(role, "get", url)
            assert status == 302 and location.startswith(at_login), (role, url)
        assert answer("staff", "get", url)[0] == 403, url
        assert answer("operator", "get", url)[0] == 200, url
        assert answer("admin", "get", url)[0] == 200, url
    for action in [*CONSOLE_ACTIONS, "no-such-action"]:
        url = reverse("console:action", kwargs={"public_id": order.public_id, "action": action})
        data = {"reason": "matrix", "days": "7", "from_lot": "1", "to_lot": "2"}
        for role in ("anonymous", "researcher"):
            status, location = answer(role, "post", url, data)
            assert status == 302 and location.startswith(at_login), (role, action)
        assert answer("staff", "post", url, data)[0] == 403, action
        if action in ("cancel", "no-such-action"):
            continue  # cancel is allowed on an unpaid order: it has its own cell below
        for role in ("operator", "admin"):  # allowed to try; refused for this order's state, with a message
            assert answer(role, "post", url, data) == (302, console_order), (role, action)
        order.refresh_from_db()
        assert order.status == OrderStatus.AWAITING_PAYMENT, action
    for role in ("operator", "admin"):
        url = reverse("console:action", kwargs={"public_id": order.public_id, "action": "no-such-action"})
        assert answer(role, "post", url)[0] == 403, role

    # Django's admin: its index for any staff; the models for those who hold their permissions (admins here).
    for role in ("anonymous", "researcher"):
        status, location = answer(role, "get", reverse("admin:index"))
        assert status == 302 and location.startswith(at_login), role
    for role in ("staff", "operator", "admin"):
        assert answer(role, "get", reverse("admin:index"))[0] == 200, role
    for model in ADMIN_CHANGELISTS:
        url = reverse(f"admin:{model}_changelist")
        assert answer("anonymous", "get", url)[0] == 302, model
        assert answer("staff", "get", url)[0] == 403, model
        assert answer("operator", "get", url)[0] == 403, model
        assert answer("admin", "get", url)[0] == 200, model
    invoice = order.invoices.get()
    mark_paid = {"action": "mark_paid", "_selected_action": [invoice.pk]}
    invoices = reverse("admin:payments_invoice_changelist")
    assert answer("anonymous", "post", invoices, mark_paid)[0] == 302
    assert answer("staff", "post", invoices, mark_paid)[0] == 403
    assert answer("operator", "post", invoices, mark_paid)[0] == 403
    assert answer("admin", "post", invoices, mark_paid)[0] == 200  # the form asking for the reason
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.NEW and order.status == OrderStatus.AWAITING_PAYMENT

    # The cells that do change something, last: an operator cancels the unpaid order.
    cancel = reverse("console:action", kwargs={"public_id": order.public_id, "action": "cancel"})
    assert answer("operator", "post", cancel, {"reason": "matrix"}) == (302, console_order)
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED
    assert order.events.filter(actor__username="olga", to_status=OrderStatus.CANCELLED).exists()


@pytest.mark.django_db
def test_every_state_changing_request_needs_its_csrf_token(catalog, booking_data, django_user_model):
    order, token = place(Client(), booking_data())
    browser = Client(enforce_csrf_checks=True)
    kwargs = {"public_id": order.public_id, "token": token}
    posts = [
        (reverse("customer:book"), booking_data()),
        (reverse("customer:order-cancel", kwargs=kwargs), {}),
        (reverse("customer:order-paid", kwargs=kwargs), {}),
        (reverse("customer:order-asset", kwargs=kwargs), {"asset": "31337:dUSDT"}),
        (reverse("customer:order-split-trial", kwargs=kwargs), {}),
        (reverse("customer:resend-link"), {"email": "ada@example.org"}),
        (reverse("set_language"), {"language": "fr"}),
    ]
    for url, data in posts:
        assert browser.post(url, data).status_code == 403, url
    operator = django_user_model.objects.create_superuser("ada", "ada@example.org", "a-long-admin-password")
    browser.force_login(operator)
    action = reverse("console:action", kwargs={"public_id": order.public_id, "action": "cancel"})
    assert browser.post(action).status_code == 403
    order.refresh_from_db()
    assert order.status == OrderStatus.AWAITING_PAYMENT and Order.objects.count() == 1


def test_check_deploy_is_clean_with_production_settings(production_chains):
    """Clean but for the one thing a test cannot give it: the chain's node (the contracts are checked against a
    real chain in tests/payments/test_checks.py). An unreachable node is a warning, named as such."""
    result = _production(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        SECRET_KEY=PRODUCTION_SECRET_KEY,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        ALLOWED_HOSTS="book.example.org",
        CELERY_BROKER_URL="redis://127.0.0.1:6380/0",  # a server of its own, as docker-compose.yml runs it
    )
    output = result.stdout + result.stderr
    assert "System check identified 1 issue" in output, output
    assert "(payments.W001) chain 8453: its contracts could not be checked" in output


def test_production_refuses_to_start_with_the_default_secret_key(production_chains):
    result = _production("check", PAYMENTS_XPUB=NOT_DEMO_XPUB, PAYMENTS_CHAINS_FILE=str(production_chains))
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr


def test_production_refuses_to_start_without_its_record_signing_key(production_chains):
    """Unset, or the development key (public in the settings): no research record could be told from a forgery."""
    development_spelled_otherwise = "Ymlub21lLWRldmVsb3BtZW50LXJlY29yZC1rZXktLS1="  # the same 32 bytes
    not_base64_of_32_bytes = ("ab" * 32, "c2hvcnQ=", "not base64 at all!")  # e.g. `openssl rand -hex 32`
    for missing in (
        None,
        "Ymlub21lLWRldmVsb3BtZW50LXJlY29yZC1rZXktLS0=",
        development_spelled_otherwise,
        *not_base64_of_32_bytes,
    ):
        result = _production(
            "check",
            SECRET_KEY=PRODUCTION_SECRET_KEY,
            PAYMENTS_XPUB=NOT_DEMO_XPUB,
            PAYMENTS_CHAINS_FILE=str(production_chains),
            RECORD_SIGNING_KEY=missing,
        )
        assert result.returncode != 0 and "RECORD_SIGNING_KEY must be set" in result.stderr


@pytest.mark.parametrize(
    ("chains", "refusal"),
    [
        (None, "this is the demo chains file"),
        (PRODUCTION_CHAINS.replace("8453", "31337"), "chain 31337 is anvil's local demo chain"),
        (
            PRODUCTION_CHAINS.replace(
                "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "0x5FbDB2315678afecb367f032d93F642f64180aa3"
            ),
            "a demo contract (anyone can mint it)",
        ),
    ],
    ids=["demo-file", "chain-31337", "faucet-token"],
)
def test_production_refuses_the_demo_chain_and_its_tokens(tmp_path, chains, refusal):
    path = ROOT / "payments" / "chains.demo.toml"
    if chains is not None:
        path = tmp_path / "chains.toml"
        path.write_text(chains)
    result = _production(
        "check", SECRET_KEY=PRODUCTION_SECRET_KEY, PAYMENTS_XPUB=NOT_DEMO_XPUB, PAYMENTS_CHAINS_FILE=str(path)
    )
    assert result.returncode != 0 and refusal in result.stderr


@pytest.mark.parametrize(
    ("site_url", "reason"),
    [
        (None, "SITE_URL='http://127.0.0.1:8000' is refused when DEBUG is off: a loopback address"),
        ("http://book.example.org", "SITE_URL='http://book.example.org' is refused when DEBUG is off: plain http"),
        ("https://10.8.0.1", "SITE_URL='https://10.8.0.1' is refused when DEBUG is off: a private address"),
    ],
    ids=["unset", "plain-http", "private-address"],
)
def test_production_refuses_a_site_address_whose_links_are_dead_or_readable(production_chains, site_url, reason):
    result = _production(
        "check",
        SECRET_KEY=PRODUCTION_SECRET_KEY,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        SITE_URL=site_url,
    )
    assert result.returncode != 0 and reason in result.stderr, result.stderr[-2000:]
    assert "set SITE_URL_PRIVATE_NETWORK=1 if it is only reached inside your own network" in result.stderr


def test_a_lab_on_its_own_network_may_serve_plain_http_once_it_says_so(production_chains):
    refused = _production(
        "check",
        SECRET_KEY=PRODUCTION_SECRET_KEY,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        SITE_URL="http://10.8.0.1:8000",
    )
    accepted = _production(
        "check",
        SECRET_KEY=PRODUCTION_SECRET_KEY,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        SITE_URL="http://10.8.0.1:8000",
        SITE_URL_PRIVATE_NETWORK="1",
        ALLOWED_HOSTS="10.8.0.1",
    )
    assert refused.returncode != 0 and "a private address" in refused.stderr
    assert accepted.returncode == 0, accepted.stderr[-2000:]


@pytest.mark.parametrize(
    ("email_url", "reason"),
    [
        (None, "consolemail:// prints every e-mail, secret order links included, to the worker's output"),
        ("consolemail://", "consolemail:// prints every e-mail"),
        ("filemail:////tmp/binome-mail", "filemail:// writes every e-mail"),
        ("dummymail://", "dummymail:// drops every e-mail"),
    ],
    ids=["unset", "console", "file", "dummy"],
)
def test_production_refuses_a_development_mail_backend(production_chains, email_url, reason):
    result = _production(
        "check",
        SECRET_KEY=PRODUCTION_SECRET_KEY,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        EMAIL_URL=email_url,
    )
    assert result.returncode != 0 and "EMAIL_URL is refused when DEBUG is off" in result.stderr
    assert reason in result.stderr, result.stderr[-2000:]


def test_the_worker_that_sends_the_links_refuses_to_start_with_console_mail(production_chains):
    """The worker sends the e-mails: it is the process that would print every order's key to its output."""
    result = _production(
        command=("bash", "bin/worker"),
        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",  # celery, from the virtualenv
        SECRET_KEY=PRODUCTION_SECRET_KEY,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        EMAIL_URL="consolemail://",
    )
    assert result.returncode != 0 and "EMAIL_URL is refused when DEBUG is off" in result.stderr
    assert "ready." not in result.stdout + result.stderr


@pytest.mark.django_db
def test_production_refuses_the_demo_operator_with_its_public_password(settings):
    from django.core.checks import run_checks

    from provisioning.demo import DEMO_OPERATOR_PASSWORD, seed_demo_operator

    seed_demo_operator()
    settings.REFUSE_DEMO_PIECES = True  # what DEBUG off sets
    refused = [error.id for error in run_checks(databases=["default"])]
    user = get_user_model().objects.get(username="operator")
    user.set_password("a-password-of-its-own-now")
    user.save()
    cleared = [error.id for error in run_checks(databases=["default"])]

    assert "provisioning.E001" in refused and "provisioning.E001" not in cleared
    assert DEMO_OPERATOR_PASSWORD not in user.password


def test_the_web_process_refuses_to_start_when_it_can_read_the_provisioning_key(tmp_path, production_chains):
    key = tmp_path / "provisioning_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    result = _production(
        command=("bash", "bin/web"),
        SECRET_KEY=PRODUCTION_SECRET_KEY,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        PROVISIONING_SSH_KEY_FILE=str(key),
    )
    assert result.returncode == 1 and "can read the provisioning SSH key" in result.stderr


def test_docker_compose_has_no_default_password_and_serves_gunicorn_through_the_proxy():
    compose = (ROOT / "docker-compose.yml").read_text()
    nginx = (ROOT / "deploy" / "nginx" / "site.conf").read_text()
    services = dict(re.findall(r"(?m)^  ([a-z-]+):\n((?:    .*\n|\n)+)", compose.split("\nservices:\n", 1)[1]))

    assert "POSTGRES_PASSWORD:-" not in compose and "${POSTGRES_PASSWORD:?" in compose
    assert "${SITE_URL:?" in compose and "${EMAIL_URL:?" in compose  # production refuses the development ones
    assert "ports:" in services["proxy"] and "ports:" not in services["web"]
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in nginx
    assert "proxy_set_header X-Forwarded-Proto" in nginx and "TRUSTED_PROXY_COUNT: ${TRUSTED_PROXY_COUNT:-1}" in compose
    assert [name for name, body in services.items() if "provisioning_ssh_key" in body] == ["worker"]
    assert 'profiles: ["demo"]' in services["chain"] and 'profiles: ["demo"]' in services["chain-setup"]


def _sign_in(client: Client, password: str):
    return client.post(reverse("admin:login"), {"username": "olga", "password": password, "next": "/console/"})


@pytest.mark.django_db
def test_staff_sign_in_is_paused_after_repeated_failures_from_one_address(django_user_model, settings):
    settings.AXES_FAILURE_LIMIT = 3
    operator = django_user_model.objects.create_user("olga", password="the-right-long-password", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="operate_orders"))
    attacker = Client(REMOTE_ADDR="203.0.113.66")

    failures = [_sign_in(attacker, f"guess-{index}").status_code for index in range(3)]
    locked = _sign_in(attacker, "the-right-long-password")
    elsewhere = _sign_in(Client(REMOTE_ADDR="198.51.100.20"), "the-right-long-password")

    assert failures == [200, 200, 429]  # the login form again, then paused at the limit
    assert locked.status_code == 429 and "Sign-in paused" in locked.content.decode()
    assert "After 3 failed sign-ins" in locked.content.decode() and "30 minutes" in locked.content.decode()
    assert elsewhere.status_code == 302 and elsewhere["Location"] == "/console/"


@pytest.mark.django_db
def test_a_very_long_username_is_an_ordinary_failed_sign_in(client):
    response = client.post(reverse("admin:login"), {"username": "<" * 5000, "password": "x"})  # once a 500
    assert response.status_code == 200 and "Please enter the correct username and password" in response.content.decode()


@pytest.mark.django_db
def test_the_sign_in_pause_is_explained_in_french(django_user_model, settings):
    settings.AXES_FAILURE_LIMIT = 1
    django_user_model.objects.create_user("olga", password="the-right-long-password", is_staff=True)
    client = Client(REMOTE_ADDR="203.0.113.66", HTTP_ACCEPT_LANGUAGE="fr")

    locked = _sign_in(client, "wrong")

    page = locked.content.decode()
    assert locked.status_code == 429 and "Connexion suspendue" in page
    assert "Après 1 échec de connexion" in page and "Réessayez dans 30 minutes" in page
