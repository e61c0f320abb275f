""" "Check host": the isolation probe against the real sshd on loopback (podman, and mknod stand-ins for the GPU
device nodes), what the host records, and what booking then offers."""

import os
import secrets
import stat
from pathlib import Path

import pytest
from django.urls import reverse

from booking.models import Order, OrderEvent, OrderStatus
from booking.selectors import free_lot_ids, offered_lots
from inventory.models import Host
from provisioning import host_probe
from provisioning.drivers import get_driver
from provisioning.hosts import HOST_CHECK_INTERVAL, HostCheck, host_check, hosts_check_due
from provisioning.rules import ProvisioningError
from tests.builders.hosts import NO_RUNTIME
from tests.provisioning.conftest import loopback_port_base

pytestmark = pytest.mark.django_db


def fake_gpus(directory: Path, count: int = 4, mode: int = 0o660) -> Path:
    """Character devices standing in for /dev/nvidia0..count-1 (NVIDIA's major number), with `mode`."""
    directory.mkdir(exist_ok=True)
    for index in range(count):
        path = directory / f"nvidia{index}"
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(195, index))
        path.chmod(mode)  # not through mknod's mode: the umask would cut it
    return directory


def check(host: Host, **kwargs) -> HostCheck:
    result = host_check(host=host, **kwargs)
    host.refresh_from_db()
    return result


def test_a_host_where_podman_answers_is_isolated_by_containers(probed_host):
    result = check(probed_host)

    assert probed_host.isolation_mode == Host.Isolation.CONTAINER
    assert probed_host.offers_lots and probed_host.isolation_checked_at is not None
    assert "podman info: ok" in probed_host.isolation_report
    assert result.orders_left_unisolated == []
    assert offered_lots().filter(host=probed_host).count() == 2


def test_a_runtime_the_host_is_not_set_to_use_does_not_count_and_the_report_says_to_set_it(probed_host):
    probed_host.container_runtime = ""  # podman answers on this machine, but orders on this host run in accounts
    probed_host.save(update_fields=["container_runtime"])
    check(probed_host)

    assert probed_host.isolation_mode != Host.Isolation.CONTAINER
    assert "podman answers, but the host's container runtime is not set" in probed_host.isolation_report


def test_without_a_runtime_a_host_is_not_isolated_even_with_closed_device_nodes(probed_host, tmp_path):
    devices = fake_gpus(tmp_path / "dev", mode=0o660)
    Host.objects.filter(pk=probed_host.pk).update(container_runtime=NO_RUNTIME)
    probed_host.refresh_from_db()

    check(probed_host, device_dir=str(devices))

    # customers are never given an account on the host: without containers, nothing is offered
    assert probed_host.isolation_mode == Host.Isolation.NOT_ISOLATED and not probed_host.offers_lots
    assert f"{NO_RUNTIME} info: no answer" in probed_host.isolation_report
    assert "mode: not isolated (no container runtime answers)" in probed_host.isolation_report
    assert not offered_lots().filter(host=probed_host).exists()


def test_a_customer_account_the_host_could_log_in_leaves_the_host_not_isolated(probed_host, admin):
    # an account of the earlier design: a login shell and a home of the customer's own (PAM, rc files, units)
    user = f"bn-legacy{secrets.token_hex(3)}"
    admin.run(["useradd", "--create-home", "--shell", "/bin/sh", user])
    try:
        check(probed_host)
        report = probed_host.isolation_report
        assert probed_host.isolation_mode == Host.Isolation.NOT_ISOLATED and not probed_host.offers_lots
        assert f"customer account {user} has a login shell (/bin/sh)" in report
        assert f"home /home/{user} of a customer account is theirs to write ({user}" in report
    finally:
        admin.run(["userdel", "--remove", user], check=False)
    check(probed_host)  # the account gone, the host is isolated again
    assert probed_host.isolation_mode == Host.Isolation.CONTAINER


def test_a_user_manager_lingering_for_a_customer_leaves_the_host_not_isolated(probed_host, admin):
    # systemd's linger file: a user manager started at boot for the account, reading units from its home
    user = f"bn-linger{secrets.token_hex(3)}"
    admin.run(["sh", "-c", 'mkdir -p /var/lib/systemd/linger && : > "/var/lib/systemd/linger/$1"', "plant", user])
    try:
        check(probed_host)
        assert probed_host.isolation_mode == Host.Isolation.NOT_ISOLATED
        assert f"a user manager lingers for {user} (/var/lib/systemd/linger/{user})" in probed_host.isolation_report
    finally:
        admin.run(["rm", "-f", f"/var/lib/systemd/linger/{user}"], check=False)
    check(probed_host)
    assert probed_host.isolation_mode == Host.Isolation.CONTAINER


def test_one_world_accessible_card_leaves_a_shared_host_not_isolated_and_its_lots_not_offered(
    probed_host, tmp_path, catalog, booking_data, client
):
    devices = fake_gpus(tmp_path / "dev", mode=0o660)
    (devices / "nvidia2").chmod(0o666)
    (devices / "nvidia3").unlink()
    Host.objects.filter(pk=probed_host.pk).update(container_runtime=NO_RUNTIME)
    probed_host.refresh_from_db()

    check(probed_host, device_dir=str(devices))

    assert probed_host.isolation_mode == Host.Isolation.NOT_ISOLATED and not probed_host.offers_lots
    report = probed_host.isolation_report
    assert f"{devices}/nvidia2: world-accessible (mode 0666" in report and f"{devices}/nvidia3: missing" in report
    assert "set the host's container runtime to podman" in report
    assert not offered_lots().filter(host=probed_host).exists()
    # The customer's booking page sees no free B200 lot: the host's lots are not offered.
    response = client.post("/book/", booking_data(lots="1"))
    assert response.status_code != 302 and not Order.objects.exists()


def test_a_booked_order_on_a_host_found_not_isolated_is_kept_and_flagged(
    probed_host, tmp_path, client, booking_data, admin_user
):
    from payments.selectors import current_invoice
    from payments.settlement import invoice_mark_paid
    from tests.builders.orders import place

    order, _token = place(client, booking_data(lots="1"))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test: paid by wire")
    devices = fake_gpus(tmp_path / "dev", mode=0o666)
    Host.objects.filter(pk=probed_host.pk).update(container_runtime=NO_RUNTIME)
    probed_host.refresh_from_db()

    result = check(probed_host, device_dir=str(devices))
    again = check(probed_host, device_dir=str(devices))

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID  # not cancelled
    assert result.orders_left_unisolated == [order] and again.orders_left_unisolated == []  # noted once
    notes = OrderEvent.objects.filter(order=order, reason__contains="found not isolated")
    assert notes.count() == 1 and "reassign" in notes.get().reason
    client.force_login(admin_user)
    queue = client.get(reverse("console:queue")).content.decode()
    hosts = client.get(reverse("console:hosts")).content.decode()
    assert "Booked on a host that is not isolated" in queue and order.public_id in queue
    assert "booked orders on it" in hosts and order.public_id in hosts


def test_an_unreachable_host_keeps_its_last_finding(probed_host, sshd):
    check(probed_host)
    checked_at = probed_host.isolation_checked_at
    Host.objects.filter(pk=probed_host.pk).update(ssh_port=1)  # nothing listens there
    probed_host.refresh_from_db()

    with pytest.raises(ProvisioningError, match="Could not check probed: connection refused"):
        host_check(host=probed_host)

    probed_host.refresh_from_db()
    assert probed_host.isolation_mode == Host.Isolation.CONTAINER and probed_host.isolation_checked_at == checked_at


def test_a_dry_run_host_is_labelled_as_not_probed_and_keeps_the_demo_working(catalog, client, booking_data):
    host = Host.objects.filter(driver=Host.Driver.DRY_RUN).first()
    assert host.isolation_mode == Host.Isolation.DRY_RUN  # as the demo seeds it

    check(host)

    assert host.isolation_mode == Host.Isolation.DRY_RUN and host.offers_lots
    assert "nothing was probed" in host.isolation_report
    assert free_lot_ids(hardware_class=catalog["b200-pair"], window=_any_window(), limit=10)


def test_device_paths_name_the_lot_s_cards_only():
    nvidia = host_probe.LotDevices(name="a", vendor="nvidia", gpu_indices=(2, 3))
    amd = host_probe.LotDevices(name="b", vendor="amd", gpu_indices=(0, 1))

    assert host_probe.device_paths(nvidia, "/d") == ["/d/nvidia2", "/d/nvidia3"]
    assert host_probe.device_paths(amd) == ["/dev/dri/renderD128", "/dev/dri/renderD129"]


def test_a_hostile_stat_answer_counts_as_not_isolated(sshd):
    """What the host answers is parsed, not trusted: an unparsable mode is treated as open."""

    class LyingConnection:
        is_dry_run = False

        def __init__(self, real):
            self.real = real

        def run(self, argv, **kwargs):
            result = self.real.run(argv, **kwargs)
            if argv[0] == "stat":
                from dataclasses import replace

                return replace(result, stdout="character special file|rw-rw-rw-|root|root|/dev/nvidia0\n")
            return result

    lots = [
        host_probe.LotDevices(name="a", vendor="nvidia", gpu_indices=(0,)),
        host_probe.LotDevices(name="b", vendor="nvidia", gpu_indices=(1,)),
    ]
    with get_driver("ssh").connect(sshd.host_spec) as connection:
        finding = host_probe.probe(LyingConnection(connection), lots=lots, runtime=NO_RUNTIME)

    assert finding.mode == Host.Isolation.NOT_ISOLATED
    assert "/dev/nvidia0: world-accessible (mode 7777" in finding.report


def _any_window():
    from booking.models import BookingPolicy
    from booking.selectors import earliest_start_date, window_for

    policy = BookingPolicy.current()
    return window_for(start_date=earliest_start_date(policy=policy), days=7, policy=policy)


def test_the_beat_checks_ssh_hosts_never_checked_or_checked_long_ago(probed_host, catalog):
    from datetime import timedelta

    from django.utils import timezone

    assert hosts_check_due() == {"checked": 1, "unreachable": 0}
    probed_host.refresh_from_db()
    assert probed_host.isolation_mode == Host.Isolation.CONTAINER
    assert hosts_check_due() == {"checked": 0, "unreachable": 0}  # checked just now
    # Dry-run hosts are never probed by the beat: they keep their label.
    assert not Host.objects.filter(driver=Host.Driver.DRY_RUN, isolation_checked_at__isnull=False).exists()

    later = timezone.now() + HOST_CHECK_INTERVAL + timedelta(minutes=1)
    Host.objects.filter(pk=probed_host.pk).update(ssh_port=1)  # unreachable now: it keeps its finding
    assert hosts_check_due(now=later) == {"checked": 0, "unreachable": 1}
    probed_host.refresh_from_db()
    assert probed_host.isolation_mode == Host.Isolation.CONTAINER


def test_the_host_check_names_an_image_that_cannot_serve_a_customer_and_why(probed_host, catalog, test_image):
    import subprocess

    from booking.models import EnvironmentImage

    # an image without an SSH server (many CUDA base images), and one ready for customers, both on the host
    without = f"localhost/binome-test-nosshd:{secrets.token_hex(3)}"
    ready = f"localhost/binome-test-ready:{secrets.token_hex(3)}"
    name = f"binome-make-{secrets.token_hex(3)}"
    ulimits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
    podman = ["podman", "--runtime", "runc"]
    subprocess.run([*podman, "run", "--name", name, *ulimits, test_image, "rm", "/usr/sbin/sshd"], check=True)
    subprocess.run(["podman", "commit", "--quiet", name, without], check=True, capture_output=True)
    subprocess.run(["podman", "rm", name], check=True, capture_output=True)
    subprocess.run(["podman", "tag", test_image, ready], check=True)
    offered = EnvironmentImage.objects.filter(hardware_classes=catalog["b200-pair"]).first()
    EnvironmentImage.objects.filter(pk=offered.pk).update(image_ref=without)
    second = EnvironmentImage.objects.create(
        slug="ready-for-customers",
        name="Ready",
        image_ref=ready,
        runtime=offered.runtime,
        runtime_version=offered.runtime_version,
        pytorch_version=offered.pytorch_version,
    )
    second.hardware_classes.add(catalog["b200-pair"])
    try:
        check(probed_host)
    finally:
        subprocess.run(["podman", "rmi", "--force", without, ready], check=False, capture_output=True)

    report = probed_host.isolation_report
    assert f"image {without}: cannot be handed to a customer: it has no sshd(/usr/sbin/sshd)" in report
    assert f"image {ready}: serves SSH and the pre-flight check" in report
    assert probed_host.isolation_mode == Host.Isolation.CONTAINER  # the images are the catalog's, not the host's


def test_a_host_whose_firewall_guard_is_gone_is_not_isolated_until_it_is_rebuilt_once(probed_host, admin):
    from provisioning.containers import GUARD_IN, Runtime

    runtime = Runtime("podman")
    jump = ["-i", runtime.bridges, "-j", GUARD_IN]
    # given a host that rebooted, or whose operator flushed the firewall: the guard's jump is gone
    admin.run(["iptables", "-t", "mangle", "-D", "INPUT", *jump], check=False)
    try:
        check(probed_host)
        assert probed_host.isolation_mode == Host.Isolation.NOT_ISOLATED and not probed_host.offers_lots
        assert "firewall guard around the customers' networks is missing" in probed_host.isolation_report
    finally:
        # provisioning's own command rebuilds it; run twice, it leaves one jump and the same chain
        admin.run(runtime.guard_argv())
        admin.run(runtime.guard_argv())
    rules = admin.run(["iptables", "-t", "mangle", "-S", "INPUT"]).stdout.splitlines()
    assert rules.count(f"-A INPUT -i {runtime.bridges} -j {GUARD_IN}") == 1
    assert admin.run(["iptables", "-t", "mangle", "-S", GUARD_IN]).stdout.splitlines()[-1] == f"-A {GUARD_IN} -j DROP"
    check(probed_host)
    assert probed_host.isolation_mode == Host.Isolation.CONTAINER


@pytest.mark.parametrize(
    "cut",
    [
        ["-D", "BINOME-FWD", "1"],  # the drop between two customers' bridges (their published ports through the host)
        ["-F", "BINOME-FWD"],  # every forwarding rule
        ["-D", "BINOME-FWD", "-d", "169.254.0.0/16", "-j", "DROP"],  # the cloud's metadata service
    ],
    ids=["bridge-to-bridge-drop", "emptied", "metadata-range"],
)
def test_a_guard_whose_forwarding_chain_was_cut_counts_as_missing(probed_host, admin, cut):
    from provisioning.containers import Runtime

    runtime = Runtime("podman")
    admin.run(["iptables", "-t", "mangle", *cut])
    try:
        check(probed_host)
        assert probed_host.isolation_mode == Host.Isolation.NOT_ISOLATED and not probed_host.offers_lots
    finally:
        admin.run(runtime.guard_argv())
    check(probed_host)
    assert probed_host.isolation_mode == Host.Isolation.CONTAINER


def test_the_guard_lets_dns_through_to_the_host_s_resolvers_only(admin):
    """DNS is the one exception to "nothing private": to the resolvers the containers are given, nowhere else."""
    from provisioning.containers import GUARD_FORWARD, GUARD_IN, Runtime

    admin.run(Runtime("podman").guard_argv())
    resolvers = {
        line.split()[1]
        for line in Path("/etc/resolv.conf").read_text().splitlines()
        if line.startswith("nameserver") and "." in line and not line.split()[1].startswith("127.")
    }
    rules = admin.run(["iptables", "-t", "mangle", "-S"]).stdout.splitlines()
    dns = [rule for rule in rules if "--dport 53" in rule]
    assert dns and all(any(f"-d {resolver}/32 " in rule for resolver in resolvers) for rule in dns), dns
    assert {rule.split()[1] for rule in dns} == {GUARD_IN, GUARD_FORWARD}


def test_prepare_host_installs_the_guard_on_a_host_that_has_no_libexec_directory_yet(admin, tmp_path):
    """Debian makes no /usr/local/libexec: the first provisioning on a fresh host must make it for the guard."""
    from datetime import UTC, datetime

    from provisioning import containers, host_steps, step_context

    libexec = Path(containers.GUARD_PATH).parent
    kept = tmp_path / "libexec-before"
    if libexec.exists():
        libexec.rename(kept)  # the host as Debian leaves it
    try:
        ctx = step_context.StepContext(
            username="bn-fresh",
            comment="",
            authorized_keys="",
            gpu_indices=[0, 1],
            expect_arch="",
            expect_vendor="nvidia",
            image_ref="",
            container_runtime="podman",
            keys_expire_at=datetime.now(UTC),
            ssh_port_base=loopback_port_base(),  # below the ephemeral ports: nothing of this machine's reserved
        )
        summary = host_steps.prepare_host(admin, ctx)

        assert "firewall guard on" in summary
        guard = Path(containers.GUARD_PATH)
        assert guard.read_bytes().startswith(b"#!") and stat.S_IMODE(guard.stat().st_mode) == 0o755
    finally:
        if kept.exists() and not libexec.exists():
            kept.rename(libexec)
        elif kept.exists():
            for entry in kept.iterdir():
                if not (libexec / entry.name).exists():
                    entry.rename(libexec / entry.name)
