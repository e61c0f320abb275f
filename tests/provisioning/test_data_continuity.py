"""Data continuity, tried as a researcher who validates a split on a 3-day window and goes on to a campaign: the data
volume of order 1 is carried to order 2 on the same host (opted in from order 1's link), so the campaign starts from
the checkpoints of the trial. Against the real sshd on loopback and podman with runc (tests/provisioning/conftest)."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse

from booking.models import OrderStatus
from booking.services import order_end_early
from provisioning import download_steps, rules, runs
from provisioning.models import Access, ProvisioningRun
from tests.builders.containers import (
    _approve_and_provision,
    _download,
    _in,
    _sftp,
    outgoing_connection_from,
)
from tests.builders.orders import order_url, place
from tests.provisioning.conftest import customer_ssh, remove_user
from tests.provisioning.customer_ssh import researcher_account

pytestmark = pytest.mark.django_db


def _text(response) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).split())


def _book_again_form(client, order, token) -> dict:
    """The hidden fields of the booking page opened from the order's "book again with my data" link."""
    page = client.get(reverse("customer:order-book-again", kwargs={"public_id": order.public_id, "token": token}))
    assert page.status_code == 200 and page["Referrer-Policy"] == "same-origin"
    fields = dict(
        re.findall(r'<input type="hidden" name="(carry_from|carry_token)" value="([^"]*)"', page.content.decode())
    )
    assert fields == {"carry_from": order.public_id, "carry_token": token}
    assert 'name="carry_data"' in page.content.decode() and "checked" in page.content.decode()
    return fields


def test_data_written_in_order_1_is_in_order_2_on_the_same_host(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, start_date,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    callbacks = django_capture_on_commit_callbacks
    private_key, public_key = keypair("ada")
    made = []
    try:
        # given: order 1, handed over; the researcher leaves checkpoints (one private to them) and a link in ~
        order1, token1 = place(client, booking_data(lots="1", days="3", ssh_keys=public_key))
        made.append(rules.username_for(order1))
        access1 = _approve_and_provision(order1, admin_user, callbacks)
        write = (
            "mkdir -p ~/ckpt && echo step-1200 > ~/ckpt/latest && chmod 600 ~/ckpt/latest && chmod 700 ~/ckpt "
            "&& ln -s /etc/shadow ~/ckpt/shadow-link && echo written"
        )
        assert _in(access1, private_key, write).stdout.strip() == "written"
        assert "Book again with my data" in _text(client.get(order_url(order1, token1)))

        # when: the window ends (early: the stop criterion was met), and order 2 is booked from order 1's link
        with callbacks(execute=True):
            order_end_early(order=order1)
        order1.refresh_from_db()
        assert order1.status == OrderStatus.ENDED
        assert order1.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN).status == "succeeded"
        carry = _book_again_form(client, order1, token1)
        later = (start_date + timedelta(days=10)).isoformat()
        order2, token2 = place(
            client, booking_data(lots="1", days="7", start_date=later, ssh_keys=public_key, carry_data="on", **carry)
        )
        made.append(rules.username_for(order2))
        assert order2.carry_data_from == order1
        assert order2.allocations.get().lot.host == container_host
        assert "Carried from order " + order1.public_id in _text(client.get(order_url(order2, token2)))
        access2 = _approve_and_provision(order2, admin_user, callbacks)

        # then: order 2 logs in to its own account and finds order 1's files, its own now, private ones included
        assert access2.username != access1.username
        found = _in(access2, private_key, "cat ~/ckpt/latest && stat -c %U ~/ckpt/latest ~/ckpt ~ && touch ~/ckpt/new")
        assert found.stdout.split() == ["step-1200", access2.username, access2.username, access2.username]
        # the link was re-owned, never followed: the host's /etc/shadow is still root's
        assert admin.run(["stat", "-c", "%U", "/etc/shadow"]).stdout.strip() == "root"
        assert (
            "carried from " + access1.username
            in order2.provisioning_runs.get(kind="provision").steps.get(name="prepare_data").output
        )
        assert access2.disk_gib == access1.disk_gib == 1
        # the volume left order 1 entirely: its file is gone from root's directory, its key reaches nothing of it
        assert not admin.run(["test", "-e", f"/var/lib/binome-volumes/{access1.username}.ext4"], check=False).ok
        assert customer_ssh(access1, private_key, "cat ~/ckpt/latest").returncode != 0

        # and: order 1's page says where its data went, and offers it no more
        page = _text(client.get(order_url(order1, token1)))
        assert f"Your data volume is carried to order {order2.public_id}" in page
        assert "Book again with my data" not in page

        # and: order 1's wipe deletes its account, not the volume that moved to order 2
        with callbacks(execute=True):
            runs.access_wipe_start(order=order1, actor=admin_user)
        assert order1.provisioning_runs.get(kind=ProvisioningRun.Kind.WIPE).status == "succeeded"
        assert not admin.run(["id", access1.username], check=False).ok
        assert _in(access2, private_key, "cat ~/ckpt/latest").stdout.strip() == "step-1200"
        assert Access.objects.get(pk=access1.pk).wiped_at is not None
    finally:
        for username in made:
            remove_user(admin, username)


def test_after_the_end_sftp_reads_the_files_until_the_wipe_but_cannot_write_and_nothing_runs(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, tmp_path,
    django_capture_on_commit_callbacks, monkeypatch,
):  # fmt: skip
    callbacks = django_capture_on_commit_callbacks
    private_key, public_key = keypair("ada")
    order, token = place(client, booking_data(lots="1", days="3", ssh_keys=public_key))
    # and: between the teardown's look for a free port and the start, an outgoing connection of the host's takes it
    held, look = [], download_steps._published_ports

    def look_then_taken(conn, ctx):
        used = look(conn, ctx)
        held.append(outgoing_connection_from(next(port for port in ctx.download_ports if port not in used)))
        return used

    monkeypatch.setattr(download_steps, "_published_ports", look_then_taken)
    try:
        access = _approve_and_provision(order, admin_user, callbacks)
        _in(
            access, private_key, "mkdir -p ~/results && echo 'loss 1.93' > ~/results/final.txt && chmod 600 ~/results/*"
        )

        # when: the window ends; the teardown takes the window away and opens the download window
        with callbacks(execute=True):
            order_end_early(order=order)
        access.refresh_from_db()
        order.refresh_from_db()
        teardown = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
        said = [(step.name, step.output, step.error) for step in teardown.steps.all()]
        assert access.status == Access.Status.REVOKED and access.download_port, said
        assert access.download_port != held[0].getsockname()[1]  # the next free port: the window opened regardless
        assert access.download_until == order.ends_at + timedelta(days=7)
        assert customer_ssh(access, private_key, "true").returncode != 0  # the window's own server is gone
        page = _text(client.get(order_url(order, token)))
        assert access.sftp_command in page and access.download_known_hosts_line in page
        # the page's line, typed as written from the researcher's own account (their key, the page's host key line)
        typed_line = re.search(r"sftp -P \d+ \S+@\S+", page)[0]
        with researcher_account(private_key, access.download_known_hosts_line) as typed:
            fetched = typed(f"cd && {typed_line} && cat final.txt", input="get results/final.txt\n")
        assert fetched.returncode == 0 and fetched.stdout.endswith("loss 1.93\n"), fetched.stderr
        client.cookies["django_language"] = "fr"
        assert "Téléchargez vos fichiers Jusqu’au" in _text(client.get(order_url(order, token))).replace("'", "’")
        client.cookies["django_language"] = "en"

        # then: sftp reads the files ...
        got = _sftp(access, private_key, f"get results/final.txt {tmp_path}/final.txt\n", tmp_path)
        assert got.returncode == 0, got.stderr
        assert (tmp_path / "final.txt").read_text() == "loss 1.93\n"
        # ... but writes nothing: no upload, no new directory, no removal, no change of mode
        (tmp_path / "payload.sh").write_text("#!/bin/sh\necho ran > /tmp/ran\n")
        for batch in (
            f"put {tmp_path}/payload.sh payload.sh\n",
            "mkdir made\n",
            "rm results/final.txt\n",
            "chmod 755 results/final.txt\n",
        ):
            assert _sftp(access, private_key, batch, tmp_path).returncode != 0, batch
        assert _sftp(access, private_key, "ls results\n", tmp_path).stdout.split()[-1:] == ["results/final.txt"]
        # ... and no command of the customer's runs: every session is sshd's read-only internal-sftp
        assert "ran" not in _download("ssh", access, private_key, tmp_path, "echo ran").stdout
        shell = _download("ssh", access, private_key, tmp_path, "-tt", "", input="id\n")
        assert "uid=" not in shell.stdout
        forward = _download("ssh", access, private_key, tmp_path, "-W", "127.0.0.1:22", "")
        assert forward.returncode != 0 and "SSH-2.0" not in forward.stdout
        # the same client did log in: the key and the host key are right, only the session is sftp's
        assert _sftp(access, private_key, "pwd\n", tmp_path).returncode == 0
        listed = admin.run(["podman", "top", f"binome-{access.username}-files", "comm"]).stdout.split()[1:]
        assert set(listed) <= {"catatonit", "podman-init", "sshd", "sshd-session"}, listed

        # and: the wipe closes the window with the files
        with callbacks(execute=True):
            runs.access_wipe_start(order=order, actor=admin_user)
        assert order.provisioning_runs.get(kind=ProvisioningRun.Kind.WIPE).status == "succeeded"
        assert not admin.run(["podman", "container", "exists", f"binome-{access.username}-files"], check=False).ok
        assert _sftp(access, private_key, "ls\n", tmp_path).returncode != 0
    finally:
        for sock in held:
            sock.close()
        remove_user(admin, rules.username_for(order))
