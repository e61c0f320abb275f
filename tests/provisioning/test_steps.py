"""The steps against a customer who fights back: symlinks planted in their home before every step of provisioning,
of a pre-flight re-run and of teardown must never make root change anything outside that home. Real sshd."""

import hashlib
import os
import secrets
import shutil
import stat
from pathlib import Path

import pytest

from booking.models import OrderStatus
from payments.selectors import current_invoice
from payments.services import invoice_mark_paid
from provisioning import services, steps
from provisioning.models import ProvisioningRun
from tests.booking.test_pages import place
from tests.provisioning.conftest import remove_user

pytestmark = pytest.mark.django_db

SECRET = "root-only secret " + secrets.token_hex(8)


@pytest.fixture
def system_paths():
    """Root-owned stand-ins for /etc and /etc/shadow (the real ones are not put at risk on a shared machine): a
    directory with a world-readable file and a root-only secret, and a second directory."""
    root = Path(f"/var/lib/binome-test-system-{secrets.token_hex(4)}")
    (root / "etc").mkdir(parents=True, mode=0o755)
    (root / "ssh").mkdir(mode=0o755)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "shadow").write_text(SECRET + "\n")
    (root / "etc" / "shadow").chmod(0o600)
    (root / "ssh" / "authorized_keys").write_text("# the operators' keys\n")
    for path in (root, root / "etc", root / "ssh"):
        path.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def snapshot(root: Path) -> dict[str, tuple]:
    """Owner, group, mode and content of everything under root, without following links."""
    state = {}
    for directory, names, files in os.walk(root):
        for name in [".", *names, *files]:
            path = Path(directory) / name
            info = path.lstat()
            content = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else None
            state[str(path)] = (info.st_uid, info.st_gid, stat.filemode(info.st_mode), content)
    return state


def plant(admin, username: str, system: Path, round_number: int) -> None:
    """As the customer: point ~/.binome, ~/.ssh (or ~/.ssh/authorized_keys), ~/.bashrc, ~/.profile and the
    environment file at system paths, moving aside whatever was there."""
    home = admin.run(["getent", "passwd", username]).stdout.split(":")[5]
    targets = {
        ".binome": system / "etc",
        ".bashrc": system / "etc" / "passwd",
        ".profile": system / "etc" / "shadow",
        steps.ENV_FILE: system / "etc" / "passwd",
    }
    if round_number % 2:  # alternately: ~/.ssh itself, or the key file inside a real ~/.ssh
        targets[".ssh/authorized_keys"] = system / "ssh" / "authorized_keys"
    else:
        targets[".ssh"] = system / "ssh"
    script = "set -e\n"
    for index, (name, target) in enumerate(targets.items()):
        path = f"{home}/{name}"
        if name == ".ssh/authorized_keys":
            script += f'[ -L "{home}/.ssh" ] && rm -f "{home}/.ssh"; mkdir -p "{home}/.ssh"\n'
        aside = f"{path}.aside-{round_number}-{index}"
        script += f'if [ -e "{path}" ] || [ -L "{path}" ]; then mv -T "{path}" "{aside}"; fi\n'
        script += f'ln -s "{target}" "{path}"\n'
    admin.run(["runuser", "-u", username, "--", "sh", "-c", script])


@pytest.fixture(params=["account", "container"])
def any_host(request):
    """(host, its sshd) for each kind of host: the account as the environment, or a container per order."""
    if request.param == "container":
        return request.getfixturevalue("container_host"), request.getfixturevalue("container_sshd")
    return request.getfixturevalue("loopback_host"), request.getfixturevalue("sshd")


def test_symlinks_planted_before_every_step_never_make_root_touch_what_they_point_to(
    client,
    any_host,
    booking_data,
    keypair,
    admin_user,
    admin,
    system_paths,
    monkeypatch,
    django_capture_on_commit_callbacks,
):
    _host, server = any_host
    private_key, public_key = keypair("customer")
    order, _token = place(client, booking_data(lots="1", ssh_keys=public_key))
    username = services.username_for(order)
    before = snapshot(system_paths)
    planted = []

    def trapped(name, step):
        def run_step(conn, ctx):
            if admin.run(["id", "-u", username], check=False).ok:
                plant(admin, username, system_paths, len(planted))
                planted.append(name)
            return step(conn, ctx)

        return run_step

    for name, step in list(steps.STEPS.items()):
        monkeypatch.setitem(steps.STEPS, name, trapped(name, step))
    try:
        # given a provisioned order, the customer having planted links before every step but the first two
        invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
        services.order_approve(order=order, actor=admin_user)
        with django_capture_on_commit_callbacks(execute=True):
            services.provisioning_start(order=order, actor=admin_user)
        with django_capture_on_commit_callbacks(execute=True):  # no GPU here: the check fails, an operator decides
            services.provisioning_hand_over(order=order, actor=admin_user, reason="test machine without GPU")
        order.refresh_from_db()
        provision = order.provisioning_runs.get()
        assert provision.status == ProvisioningRun.Status.SUCCEEDED, provision.error
        assert order.status == OrderStatus.READY

        # when the pre-flight check is run again, then the access torn down, links planted before every step
        with django_capture_on_commit_callbacks(execute=True):
            services.preflight_rerun(order=order, actor=admin_user)
        rerun = order.provisioning_runs.get(kind=ProvisioningRun.Kind.PREFLIGHT)
        assert rerun.status == ProvisioningRun.Status.SUCCEEDED, rerun.error
        with django_capture_on_commit_callbacks(execute=True):
            services.teardown_start(order=order, actor=admin_user, reason="test")
        teardown = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
        assert teardown.status == ProvisioningRun.Status.SUCCEEDED, teardown.error

        # then every step ran over planted links, and nothing outside the home changed owner, mode or content
        after_create = steps.PROVISION_STEPS[steps.PROVISION_STEPS.index("create_user") + 1 :]
        assert planted == [*after_create, *steps.PREFLIGHT_STEPS, *steps.TEARDOWN_STEPS]
        assert snapshot(system_paths) == before
        # nor did root copy a file the customer may not read into the home
        leaked = admin.run(["grep", "-rlF", "--no-messages", SECRET, f"/home/{username}"], check=False)
        assert leaked.stdout == ""
        assert server.login_as(username, private_key, "true").returncode != 0
    finally:
        remove_user(admin, username)


def test_the_home_is_private_and_the_kit_is_root_owned_and_read_only(
    client, loopback_host, booking_data, keypair, admin_user, admin, login_as, django_capture_on_commit_callbacks
):
    private_key, public_key = keypair("customer")
    order, _token = place(client, booking_data(lots="1", ssh_keys=public_key))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    services.order_approve(order=order, actor=admin_user)
    username = services.username_for(order)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            services.provisioning_start(order=order, actor=admin_user)

        listing = login_as(
            username,
            private_key,
            "stat -c '%a %U' ~ ~/.binome/ ~/.binome/preflight.py ~/.binome/split_trial.py; "
            "echo x >> ~/.binome/preflight.py || echo refused",
        )
        assert listing.returncode == 0, listing.stderr
        home, kit, preflight, split_trial, write = listing.stdout.splitlines()
        assert home == f"700 {username}"
        assert kit == "755 root" and preflight == "555 root" and split_trial == "555 root"
        assert write == "refused"
    finally:
        remove_user(admin, username)
