"""The health check of hosts with running windows, against the real sshd with a stand-in nvidia-smi: SSH reachable,
the lots' GPUs present, free disk space, recorded on the host, and the operators alerted once per failure."""

import pytest
from django.urls import reverse

from inventory.models import Host
from provisioning.health import hosts_health_check as check_hosts
from tests.builders.hosts import NVIDIA_SMI
from tests.provisioning.customer_ssh import login_as, provisioned  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

ALERT = "[Binôme] Host loopback is failing its health check"


def _alerts(mailoutbox) -> list:
    return [mail for mail in mailoutbox if mail.subject == ALERT]


def test_a_failing_host_alerts_the_operators_once_per_failure_and_its_page_shows_why(
    provisioned,  # noqa: F811
    stand_in_nvidia_smi,
    settings,
    mailoutbox,
    client,
    operator,
    django_capture_on_commit_callbacks,
):
    def hosts_health_check() -> dict:
        with django_capture_on_commit_callbacks(execute=True):  # the alert leaves once the finding is committed
            return check_hosts()

    order, _token, _username, _key = provisioned
    settings.ADMINS = [("Olga", "olga@ops.example.org")]
    host = order.accesses.get().host

    # a healthy host: recorded, nobody alerted
    assert hosts_health_check() == {"ok": 1, "failing": 0, "alerted": 0}
    host.refresh_from_db()
    assert host.health_status == Host.HealthStatus.OK and host.health_checked_at is not None
    assert "ok SSH reachable" in host.health_report and "ok GPUs [0, 1] answer" in host.health_report
    assert "ok disk /:" in host.health_report
    assert _alerts(mailoutbox) == []

    # GPU 0 falls off the bus: the tool lists the others only
    stand_in_nvidia_smi.write_text("#!/bin/sh\ncat <<'END'\n" + NVIDIA_SMI.split("\n", 1)[1] + "END\n")
    assert hosts_health_check()["alerted"] == 1
    assert hosts_health_check() == {"ok": 0, "failing": 1, "alerted": 0}  # still failing: no second alert
    host.refresh_from_db()
    assert host.health_status == Host.HealthStatus.FAILING
    [alert] = _alerts(mailoutbox)
    assert alert.to == ["olga@ops.example.org"] and "GPUs missing from" in alert.body and "[0]" in alert.body
    client.force_login(operator)
    page = client.get(reverse("console:host", kwargs={"name": host.name})).content.decode()
    assert "Failing" in page and "FAIL GPUs missing from" in page
    hosts_page = client.get(reverse("console:hosts")).content.decode()
    assert "status-health-failing" in hosts_page.split(f'id="host-{host.name}"')[1].split("</tr>")[0]

    # repaired, then the disks fill: a new failure, a new alert
    stand_in_nvidia_smi.write_text(f"#!/bin/sh\ncat <<'END'\n{NVIDIA_SMI}END\n")
    assert hosts_health_check() == {"ok": 1, "failing": 0, "alerted": 0}
    settings.HOST_HEALTH_MIN_FREE_GIB = 10**9
    assert hosts_health_check()["alerted"] == 1
    assert len(_alerts(mailoutbox)) == 2 and "under 1000000000 GiB" in _alerts(mailoutbox)[1].body

    # repaired again, then SSH stops answering: a third failure, a third alert
    settings.HOST_HEALTH_MIN_FREE_GIB = 0
    assert hosts_health_check()["ok"] == 1
    Host.objects.filter(pk=host.pk).update(ssh_port=1)  # nothing listens there
    assert hosts_health_check()["alerted"] == 1
    host.refresh_from_db()
    assert "FAIL SSH unreachable: " in host.health_report and "connection refused" in host.health_report
    assert len(_alerts(mailoutbox)) == 3


def test_hosts_without_running_windows_are_not_checked(catalog, mailoutbox):
    assert check_hosts() == {"ok": 0, "failing": 0, "alerted": 0}
    assert not Host.objects.exclude(health_status=Host.HealthStatus.UNKNOWN).exists()
