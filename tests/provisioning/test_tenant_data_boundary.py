"""Red team of issue 22's tenant boundary (data carried to the next order, the read-only download window after the
end, keys changed during the window) and issue 21's provider-fault move, as a customer who controls their keys,
their files and their SSH client. Against the real sshd on loopback and podman with runc (tests/provisioning/
conftest). A test whose docstring starts with VULNERABILITY fails while the hole is open; HELD ones pass."""

import pytest
from django.urls import reverse

from booking.services import order_end_early
from inventory.models import Host, Lot
from provisioning import moves, rules, services
from provisioning.models import Access, ProvisioningRun
from tests.builders.containers import _approve_and_provision, _sftp
from tests.builders.orders import place
from tests.provisioning.conftest import _free_port, customer_ssh, loopback_port_base, remove_user

pytestmark = pytest.mark.django_db


def _two_keys(order, laptop_public: str):
    """The order's key whose data is the laptop's."""
    return next(key for key in order.ssh_keys.all() if laptop_public.split()[1] in key.public_key)


def test_key_removed_while_a_move_is_pending_still_logs_in_to_the_old_host(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, django_capture_on_commit_callbacks
):
    """HELD (was VULNERABILITY): a provider-fault move to another host releases the old lot at once, but the old
    host is torn down only when the move succeeds; meanwhile (and for the rest of the window if the move fails) the
    customer keeps working on the old container. A key removed then (a stolen laptop) was written only on the
    order's held hosts, never on the old host, where it still logged in. The keys run now goes wherever the customer
    can log in (runs.access_keys_renew): the removed key is refused there."""
    callbacks = django_capture_on_commit_callbacks
    ada_key, ada_public = keypair("ada")
    laptop_key, laptop_public = keypair("laptop")
    order, _token = place(client, booking_data(lots="1", days="3", ssh_keys=f"{ada_public}\n{laptop_public}"))
    try:
        access = _approve_and_provision(order, admin_user, callbacks)
        assert customer_ssh(access, laptop_key, "true").returncode == 0
        # given: the operator moves the order to another host after a provider fault; that host does not answer
        # (yet), so the move fails and the order stays on the old container, "until an operator retries"
        other = Host.objects.create(
            name="other", address="127.0.0.1", ssh_port=_free_port(), driver=Host.Driver.SSH, admin_user="root",
            host_key=container_host.host_key, container_runtime="podman", disk_per_lot_gib=1,
            ssh_port_base=loopback_port_base(),
        )  # fmt: skip
        spare = Lot.objects.create(name="other · GPUs 0,1", hardware_class=catalog["b200-pair"], host=other,
                                   gpu_indices="0,1")  # fmt: skip
        held = order.allocations.get(released_at__isnull=True).lot
        with callbacks(execute=True):
            moves.order_move(order=order, from_lot_id=held.pk, to_lot_id=spare.pk, actor=admin_user)
        move = order.provisioning_runs.get(kind=ProvisioningRun.Kind.MOVE)
        assert move.status == ProvisioningRun.Status.FAILED
        assert customer_ssh(access, ada_key, "true").returncode == 0  # the customer works on the old host

        # when: the customer removes their stolen laptop's key from the order page
        with callbacks(execute=True):
            run = services.access_keys_change(order=order, add=[], remove_ids=[_two_keys(order, laptop_public).pk])
        assert run is not None  # "applied": a keys run was started, and the e-mail says so
        # ... on the old host, where the customer works (the new one gets the keys of the day when its move runs)
        assert set(run.steps.values_list("host_id", flat=True)) == {container_host.pk}

        # then: the removed key must not log in anywhere the order still runs
        still = customer_ssh(Access.objects.select_related("host").get(pk=access.pk), laptop_key, "echo in")
        assert still.returncode != 0, "the removed key still logs in to the old host's container"
    finally:
        remove_user(admin, rules.username_for(order))


def test_a_key_cannot_be_removed_from_the_download_window_after_the_end(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, tmp_path,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    """HELD (was VULNERABILITY): the download window reads the order's files for wipe_after_days (7) after the end,
    with the keys as they were at the teardown, and keys could not change after the end: a laptop lost then kept
    read access to every file until the wipe. Keys now change after the end too, and a run of kind download_keys
    rewrites the window's keys at once: the removed key reads nothing."""
    callbacks = django_capture_on_commit_callbacks
    _ada_key, ada_public = keypair("ada")
    laptop_key, laptop_public = keypair("laptop")
    order, _token = place(client, booking_data(lots="1", days="3", ssh_keys=f"{ada_public}\n{laptop_public}"))
    try:
        access = _approve_and_provision(order, admin_user, callbacks)
        customer_ssh(access, laptop_key, "echo secret > ~/results.txt")
        with callbacks(execute=True):
            order_end_early(order=order)
        access.refresh_from_db()
        assert access.download_port
        # when: the laptop is lost after the end; the customer removes its key from the order page
        with callbacks(execute=True):
            run = services.access_keys_change(order=order, add=[], remove_ids=[_two_keys(order, laptop_public).pk])
        run.refresh_from_db()
        assert run.kind == ProvisioningRun.Kind.DOWNLOAD_KEYS and run.status == ProvisioningRun.Status.SUCCEEDED
        # then: the lost laptop's key must not read the files any more
        got = _sftp(access, laptop_key, "ls\n", tmp_path)
        assert got.returncode != 0, f"the lost key still reads the files until the wipe: {got.stdout.split()}"
        assert _sftp(access, _ada_key, "ls\n", tmp_path).returncode == 0  # the key kept still reads them
    finally:
        remove_user(admin, rules.username_for(order))


def test_held_download_window_refuses_a_removed_key_and_links_reach_nothing_of_the_host(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, tmp_path,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    """HELD: a key removed during the window is not in the download window's keys; links the customer leaves in the
    volume (to root's volume directory, the kit root of every account) resolve inside the download
    container, which holds none of the host's or another tenant's files."""
    callbacks = django_capture_on_commit_callbacks
    ada_key, ada_public = keypair("ada")
    laptop_key, laptop_public = keypair("laptop")
    order, _token = place(client, booking_data(lots="1", days="3", ssh_keys=f"{ada_public}\n{laptop_public}"))
    try:
        access = _approve_and_provision(order, admin_user, callbacks)
        links = "ln -s /var/lib/binome-volumes ~/volumes && ln -s /var/lib/binome ~/kits && echo ok > ~/mine"
        assert customer_ssh(access, ada_key, links).returncode == 0
        with callbacks(execute=True):
            services.access_keys_change(order=order, add=[], remove_ids=[_two_keys(order, laptop_public).pk])
            order_end_early(order=order)
        access.refresh_from_db()
        assert access.download_port
        assert _sftp(access, laptop_key, "ls\n", tmp_path).returncode != 0
        assert _sftp(access, ada_key, "ls mine\n", tmp_path).returncode == 0
        for path in ("volumes", "kits"):
            listed = _sftp(access, ada_key, f"ls {path}/\n", tmp_path)
            assert listed.returncode != 0, listed.stdout
    finally:
        remove_user(admin, rules.username_for(order))


def test_held_carry_needs_the_earlier_orders_own_token_and_closes_its_download_window(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, tmp_path, start_date,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    """HELD: another customer's order cannot be carried with the attacker's own link token (the token is checked
    against the public id it names); once a volume is carried, the earlier order's download window is closed and
    its key reads nothing of the data that left it."""
    from datetime import timedelta

    from booking.models import Order

    callbacks = django_capture_on_commit_callbacks
    key, public = keypair("ada")
    order1, token1 = place(client, booking_data(lots="1", days="3", ssh_keys=public))
    made = [rules.username_for(order1)]
    try:
        access1 = _approve_and_provision(order1, admin_user, callbacks)
        customer_ssh(access1, key, "echo victim-data > ~/secret")
        with callbacks(execute=True):
            order_end_early(order=order1)
        access1.refresh_from_db()
        assert _sftp(access1, key, "ls\n", tmp_path).returncode == 0  # the download window is open
        later = (start_date + timedelta(days=10)).isoformat()
        # an attacker with an order of their own names the victim's order with their own token: refused
        elsewhere = (start_date + timedelta(days=40)).isoformat()
        _attacker, attacker_token = place(
            client, booking_data(lots="1", days="3", ssh_keys=public, start_date=elsewhere)
        )
        before = Order.objects.count()
        forged = client.post(
            reverse("customer:book"),
            booking_data(lots="1", days="7", start_date=later, ssh_keys=public, carry_data="on",
                         carry_from=order1.public_id, carry_token=attacker_token),
        )  # fmt: skip
        assert Order.objects.count() == before and forged.status_code != 302
        assert "no longer works" in forged.content.decode()
        # the owner carries it: the earlier order's download window closes with the move of its volume
        later2 = (start_date + timedelta(days=8)).isoformat()  # before the earlier order's files are deleted
        order2, _token2 = place(
            client,
            booking_data(lots="1", days="7", start_date=later2, ssh_keys=public, carry_data="on",
                         carry_from=order1.public_id, carry_token=token1),
        )  # fmt: skip
        made.append(rules.username_for(order2))
        _approve_and_provision(order2, admin_user, callbacks)
        assert _sftp(access1, key, "ls\n", tmp_path).returncode != 0
        assert not admin.run(["podman", "container", "exists", f"binome-{access1.username}-files"], check=False).ok
    finally:
        for username in made:
            remove_user(admin, username)


def test_a_carried_volume_is_carried_only_to_as_many_lots_as_it_was_made_for(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, start_date,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    """HELD (was VULNERABILITY): a volume is reserved in full on the host's disk (fallocate), sized by the lots paid
    for. Carried from a 2-lot order to a 1-lot one, the host's disk held 2 shares for 1 lot (co-tenants' volumes then
    refused for space), and a 2-lot order carrying a 1-lot volume got less than it paid for. A carry now needs the
    number of lots the volume was made for: refused with the reason, nothing placed; the same lots are accepted."""
    from datetime import timedelta

    from booking.models import Order

    callbacks = django_capture_on_commit_callbacks
    Lot.objects.create(name="containers · GPUs 2,3", hardware_class=catalog["b200-pair"], host=container_host,
                       gpu_indices="2,3")  # fmt: skip
    _key, public = keypair("ada")
    order1, token1 = place(client, booking_data(lots="2", days="3", ssh_keys=public))
    try:
        access1 = _approve_and_provision(order1, admin_user, callbacks)
        assert access1.disk_gib == 2
        with callbacks(execute=True):
            order_end_early(order=order1)
        later = (start_date + timedelta(days=5)).isoformat()
        carry = {"carry_data": "on", "carry_from": order1.public_id, "carry_token": token1}
        orders = Order.objects.count()
        refused = client.post(
            reverse("customer:book"), booking_data(lots="1", days="7", start_date=later, ssh_keys=public, **carry)
        )
        assert refused.status_code == 200 and Order.objects.count() == orders
        assert "Your data volume was made for 2 lots" in refused.content.decode()
        order2, _token2 = place(client, booking_data(lots="2", days="7", start_date=later, ssh_keys=public, **carry))
        assert order2.carry_data_from_id == order1.pk
    finally:
        remove_user(admin, rules.username_for(order1))


def test_a_carry_starts_between_the_earlier_end_and_the_deletion_of_its_files(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, start_date,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    """HELD (was VULNERABILITY): placing checked no date of a carry, so a carrying order could start weeks after the
    files' announced deletion date; the wipe waits for a carrier not handed over yet, so the volume (reserved in full
    on the host's disk) stayed as long as the customer chose. A carry's window now starts between the earlier
    order's end and its wipe date: a month later is refused with the range, nothing placed; inside it is accepted."""
    from datetime import timedelta

    from booking.models import Order

    callbacks = django_capture_on_commit_callbacks
    _key, public = keypair("ada")
    order1, token1 = place(client, booking_data(lots="1", days="3", ssh_keys=public))
    try:
        _approve_and_provision(order1, admin_user, callbacks)
        with callbacks(execute=True):
            order_end_early(order=order1)
        carry = {"carry_data": "on", "carry_from": order1.public_id, "carry_token": token1}
        orders = Order.objects.count()
        for too_far_or_early in (start_date + timedelta(days=40), start_date + timedelta(days=1)):
            data = booking_data(lots="1", days="3", start_date=too_far_or_early.isoformat(), ssh_keys=public, **carry)
            refused = client.post(reverse("customer:book"), data)
            assert refused.status_code == 200 and Order.objects.count() == orders
            assert "between the end of order" in refused.content.decode()
        inside = (start_date + timedelta(days=5)).isoformat()
        order2, _token2 = place(client, booking_data(lots="1", days="3", start_date=inside, ssh_keys=public, **carry))
        assert order2.carry_data_from_id == order1.pk
    finally:
        remove_user(admin, rules.username_for(order1))
