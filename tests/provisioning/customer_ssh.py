"""Fixtures for the customer's side of ssh provisioning: an order provisioned on the loopback host and the
researcher's own ssh into it (which differs from conftest's `login_as`, hence a module the tests import)."""

import os
import pwd
import secrets
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning import rules, runs, services
from provisioning.models import Access
from tests.builders.orders import place
from tests.provisioning.conftest import customer_ssh, remove_user


@pytest.fixture
def login_as():
    """login_as(user, private_key, command): the researcher's ssh to their container, as the order page says."""

    def login(user, private_key, command, *, options=(), timeout=30):
        access = Access.objects.select_related("host").get(username=user)
        return customer_ssh(access, private_key, command, options=list(options), timeout=timeout)

    return login


@pytest.fixture
def provisioned(client, loopback_host, booking_data, keypair, admin_user, admin, django_capture_on_commit_callbacks):
    private_key, public_key = keypair("customer")
    order, token = place(client, booking_data(lots="1", ssh_keys=public_key))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    services.order_approve(order=order, actor=admin_user)
    username = rules.username_for(order)
    try:  # from here on the user may exist: removed whatever happens
        with django_capture_on_commit_callbacks(execute=True):
            runs.provisioning_start(order=order, actor=admin_user)
        # No GPU on the test machine: the pre-flight check fails and the hand-over waits for an operator.
        with django_capture_on_commit_callbacks(execute=True):
            runs.provisioning_hand_over(order=order, actor=admin_user, reason="test machine without GPU")
        order.refresh_from_db()
        yield order, token, username, private_key
    finally:
        remove_user(admin, username)


@contextmanager
def researcher_account(private_key: str, known_hosts_line: str):
    """A researcher's own account on their own machine (a local user), their key where ssh looks for it and the
    order page's host key line in their known_hosts, as the page tells them: yields `typed(command, ...)`, which runs
    a command line as that user (subprocess.run's keywords; `background=True`: a Popen in its own session)."""
    researcher = "binome-test-r" + secrets.token_hex(3)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", researcher], check=True, capture_output=True)
    try:
        account = pwd.getpwnam(researcher)
        ssh_dir = Path(account.pw_dir) / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "id_ed25519").write_bytes(Path(private_key).read_bytes())
        (ssh_dir / "known_hosts").write_text(known_hosts_line + "\n")
        for path in (ssh_dir, *ssh_dir.iterdir()):
            os.chown(path, account.pw_uid, account.pw_gid)
        (ssh_dir / "id_ed25519").chmod(0o600)

        def typed(command: str, *, background: bool = False, **kwargs):
            argv = ["su", "-s", "/bin/sh", researcher, "-c", command]
            if background:
                return subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True,
                )  # fmt: skip
            if "input" not in kwargs:
                kwargs["stdin"] = subprocess.DEVNULL
            return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kwargs)

        yield typed
    finally:
        subprocess.run(["pkill", "-KILL", "-u", researcher], capture_output=True, check=False)
        subprocess.run(["userdel", "--remove", "--force", researcher], capture_output=True, check=False)
