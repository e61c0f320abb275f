"""The console's hosts: which isolation mode each host is in and why, "check host" from the console and the admin,
and what an operator is told when a host's lots are refused."""

from datetime import timedelta

import pytest
from django.urls import reverse

from inventory.models import Host, Lot
from provisioning.hosts import host_check
from tests.builders.hosts import NO_RUNTIME

pytestmark = pytest.mark.django_db


def test_operators_see_each_host_s_mode_and_why(client, operator, catalog, django_assert_max_num_queries):
    client.force_login(operator)

    with django_assert_max_num_queries(8):
        page = client.get(reverse("console:hosts")).content.decode()

    assert page.count("Dry run (demo, not probed)") == Host.objects.count()
    detail = client.get(reverse("console:host", kwargs={"name": "b200-node-01"})).content.decode()
    assert "Dry run (demo, not probed)" in detail and "Check host" in detail
    assert "/dev/shm 8g" in detail  # noqa: S108 and "not limited" in detail


def test_only_operators_reach_the_hosts_pages_and_the_check(client, catalog, django_user_model):
    check_url = reverse("console:host-check", kwargs={"name": "b200-node-01"})
    assert client.get(reverse("console:hosts")).status_code == 302
    staff = django_user_model.objects.create_user("sam", password="a-long-staff-password", is_staff=True)
    client.force_login(staff)

    assert client.get(reverse("console:hosts")).status_code == 403
    assert client.post(check_url).status_code == 403
    assert Host.objects.get(name="b200-node-01").isolation_checked_at is None


def test_checking_a_shared_host_without_runtime_refuses_its_lots_and_says_what_to_do(
    client, operator, probed_host, django_capture_on_commit_callbacks, settings, tmp_path
):
    # No runtime, two active lots, and no GPU device nodes where the host keeps them (an empty directory: whatever
    # this machine's own /dev holds): nothing keeps customers apart.
    Host.objects.filter(pk=probed_host.pk).update(container_runtime=NO_RUNTIME)
    settings.PROVISIONING_DEVICE_DIR = str(tmp_path)
    client.force_login(operator)

    with django_capture_on_commit_callbacks(execute=True):  # the queued check runs (eager worker)
        client.post(reverse("console:host-check", kwargs={"name": "probed"}))

    page = client.get(reverse("console:host", kwargs={"name": "probed"})).content.decode()
    assert "probed is not isolated: its lots are not offered to customers" in page
    assert "Install podman or docker on it" in page
    assert f"{tmp_path}/nvidia0: missing" in page  # the report, on the host's page
    hosts_page = client.get(reverse("console:hosts")).content.decode()
    assert "Not isolated" in hosts_page and "its lots are not offered" in hosts_page


def test_the_lot_admin_says_why_an_active_lot_is_not_offered(
    client,
    admin_user,
    probed_host,
):
    Host.objects.filter(pk=probed_host.pk).update(container_runtime=NO_RUNTIME)
    probed_host.refresh_from_db()
    host_check(host=probed_host)
    lot = probed_host.lots.first()
    client.force_login(admin_user)

    changelist = client.get(reverse("admin:inventory_lot_changelist")).content.decode()
    response = client.post(
        reverse("admin:inventory_lot_change", args=[lot.pk]),
        {
            "name": lot.name,
            "hardware_class": lot.hardware_class_id,
            "host": lot.host_id,
            "gpu_indices": "0,1",
            "status": Lot.Status.ACTIVE,
        },
        follow=True,
    )

    assert 'alt="False"' in changelist
    assert "is active but not offered to customers: its host probed is in the isolation mode" in (
        response.content.decode()
    )


def test_the_admin_action_queues_checks_of_the_selected_hosts(
    client, admin_user, catalog, django_capture_on_commit_callbacks
):
    host = Host.objects.get(name="b200-node-01")
    client.force_login(admin_user)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            reverse("admin:inventory_host_changelist"),
            {"action": "check_hosts", "_selected_action": [host.pk]},
            follow=True,
        )

    host.refresh_from_db()
    assert "Check queued for b200-node-01: a worker runs it over SSH" in response.content.decode()
    assert host.check_state == Host.CheckState.DONE
    assert host.isolation_checked_at is not None and "nothing was probed" in host.isolation_report


def test_check_host_runs_on_the_provisioning_queue_and_the_page_follows_it(
    client, operator, probed_host, monkeypatch, django_capture_on_commit_callbacks
):
    """The web process has no SSH key and must not wait on SSH: the click queues the check, the host's page shows
    it queued and polls, a second click queues nothing, and the worker's result is on the page when it ends."""
    from provisioning import tasks

    queued = []
    monkeypatch.setattr(tasks.check_host, "apply_async", lambda args, **kwargs: queued.append(args))
    client.force_login(operator)
    check_url = reverse("console:host-check", kwargs={"name": "probed"})
    host_url = reverse("console:host", kwargs={"name": "probed"})

    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(check_url, follow=True).content.decode()
        again = client.post(check_url, follow=True).content.decode()

    assert queued == [[probed_host.pk, operator.pk]]  # one check for two clicks
    assert "Check queued at" in first and 'hx-trigger="every 2s"' in first
    assert "A check is already under way for probed." in again
    assert Host.objects.get(pk=probed_host.pk).isolation_checked_at is None  # nothing probed by the web process
    poll = client.get(host_url, headers={"HX-Request": "true"})
    assert poll.status_code == 200 and "Check queued at" in poll.content.decode()

    assert tasks.check_host.run(*queued[0]) == Host.Isolation.CONTAINER  # the worker's side

    host = Host.objects.get(pk=probed_host.pk)
    assert host.check_state == Host.CheckState.DONE and host.isolation_mode == Host.Isolation.CONTAINER
    assert client.get(host_url, headers={"HX-Request": "true"}).headers.get("HX-Refresh") == "true"
    assert "probed: Container per order; its lots are offered." in client.get(host_url).content.decode()


def test_a_check_that_cannot_reach_the_host_says_why_and_keeps_the_previous_finding(
    client, operator, probed_host, django_capture_on_commit_callbacks
):
    Host.objects.filter(pk=probed_host.pk).update(address="127.0.0.1", ssh_port=1)  # nothing listens there
    client.force_login(operator)

    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("console:host-check", kwargs={"name": "probed"}))

    host = Host.objects.get(pk=probed_host.pk)
    page = client.get(reverse("console:host", kwargs={"name": "probed"})).content.decode()
    assert host.check_state == Host.CheckState.FAILED and host.isolation_checked_at is None
    assert "failed: Could not check probed:" in page and "The host keeps its previous finding." in page


def test_a_check_task_with_hostile_arguments_does_nothing(catalog):
    from provisioning import tasks

    assert tasks.check_host.run("1; rm -rf /", None) == "unknown"
    assert tasks.check_host.run(10**9, None) == "unknown"
    assert tasks.check_host.run(Host.objects.first().pk, "admin") == "unknown"


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("cpus_per_lot", "-2", "greater than or equal to 0"),
        ("cpus_per_lot", "1e9", "no more than 6 digits"),
        ("cpus_per_lot", "2000", "less than or equal to 1024"),
        ("cpus_per_lot", "lots", "Enter a number"),
        ("memory_per_lot_gib", "99999999", "less than or equal to 16384"),
        ("memory_per_lot_gib", "-1", "greater than or equal to 0"),
        ("shm_size_gib", "0", "greater than or equal to 1"),
        ("shm_size_gib", "64", "cannot be larger than the memory share of a lot (32 GiB)"),
        ("connections_per_lot", "-5", "greater than or equal to 0"),
        ("ptys_per_lot", "99999999", "less than or equal to 65536"),
        ("disk_mbps_per_lot", "fast", "Enter a whole number"),
        ("ready_within_minutes", "5", "greater than or equal to 10"),
        ("ready_within_minutes", "99999", "less than or equal to 1440"),
    ],
)
def test_the_host_form_refuses_hostile_shares(client, admin_user, field, value, error):
    client.force_login(admin_user)
    data = {
        "name": "gpu-new",
        "address": "gpu-new.invalid",
        "ssh_port": "22",
        "driver": Host.Driver.DRY_RUN,
        "admin_user": "root",
        "is_active": "on",
        "ready_within_minutes": "60",
        "memory_per_lot_gib": "32",
        "shm_size_gib": "8",
    }
    data[field] = value

    response = client.post(reverse("admin:inventory_host_add"), data)

    assert response.status_code == 200 and error in response.content.decode()
    assert not Host.objects.filter(name="gpu-new").exists()


def test_the_host_form_keeps_sane_shares(client, admin_user):
    client.force_login(admin_user)
    data = {
        "name": "gpu-new",
        "address": "gpu-new.invalid",
        "ssh_port": "22",
        "driver": Host.Driver.SSH,
        "admin_user": "root",
        "ready_within_minutes": "45",
        "container_runtime": "podman",
        "ssh_port_base": "42000",
        "cpus_per_lot": "12.5",
        "memory_per_lot_gib": "200",
        "shm_size_gib": "32",
        "disk_per_lot_gib": "500",
        # what every tenant draws from: the form's own values (0: the host's size split over its lots)
        "connections_per_lot": "0",
        "ptys_per_lot": "256",
        "disk_mbps_per_lot": "0",
        # the host's maintenance windows, edited inline (the formset's management form, as the browser sends it)
        "maintenance_windows-TOTAL_FORMS": "1",
        "maintenance_windows-INITIAL_FORMS": "0",
        "maintenance_windows-0-starts_at_0": "2031-05-04",
        "maintenance_windows-0-starts_at_1": "08:00:00",
        "maintenance_windows-0-ends_at_0": "2031-05-04",
        "maintenance_windows-0-ends_at_1": "02:00:00",
        "maintenance_windows-0-reason": "Firmware update",
    }

    refused = client.post(reverse("admin:inventory_host_add"), data)
    assert refused.status_code == 200 and "A maintenance window ends after it starts." in refused.content.decode()
    response = client.post(reverse("admin:inventory_host_add"), {**data, "maintenance_windows-0-ends_at_1": "20:00:00"})

    assert response.status_code == 302
    host = Host.objects.get(name="gpu-new")
    window = host.maintenance_windows.get()
    assert (window.reason, window.ends_at - window.starts_at) == ("Firmware update", timedelta(hours=12))
    assert (str(host.cpus_per_lot), host.memory_per_lot_gib, host.shm_size_gib) == ("12.50", 200, 32)
    assert (host.connections_per_lot, host.ptys_per_lot, host.disk_mbps_per_lot) == (0, 256, 0)
    assert host.ready_within_minutes == 45
    assert host.isolation_mode == Host.Isolation.UNCHECKED and host.offers_lots
    # without a container runtime a host offers nothing: customers are never given an account on a host
    Host.objects.filter(pk=host.pk).update(container_runtime="")
    host.refresh_from_db()
    assert not host.offers_lots


def test_the_hosts_pages_speak_french(client, operator, catalog, django_capture_on_commit_callbacks):
    client.force_login(operator)
    client.cookies["django_language"] = "fr"

    hosts = client.get(reverse("console:hosts")).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("console:host-check", kwargs={"name": "b200-node-01"}))
    response = client.get(reverse("console:host", kwargs={"name": "b200-node-01"}))

    assert "Hôtes" in hosts and "Simulation (démo, non sondé)" in hosts and "Pourquoi" in hosts
    page = response.content.decode()
    assert "b200-node-01 utilise le pilote de simulation : rien n’a été sondé." in page
    assert "Vérifier l’hôte" in page and "sans limite" in page
