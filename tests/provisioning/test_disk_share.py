"""The disk bandwidth share (the operator's MB/s per lot), tried as a tenant who reads and writes their home as fast
as the disk goes, bypassing the page cache. One order on the test host, against the real sshd on loopback and
podman with runc (tests/provisioning/conftest)."""

import re

import pytest

from inventory.models import Host
from tests.builders.containers import _hand_over, _in, _provision
from tests.provisioning.conftest import remove_user

pytestmark = pytest.mark.django_db

DISK_MBPS = 8  # the operator's disk bandwidth per lot, read and write (2 MB/s starved the image's sshd start)


@pytest.fixture
def alice(client, container_host, booking_data, keypair, admin_user, admin, django_capture_on_commit_callbacks):
    """One order on the test host, handed over, whose operator set a disk bandwidth per lot."""
    Host.objects.filter(pk=container_host.pk).update(disk_mbps_per_lot=DISK_MBPS)
    callbacks = django_capture_on_commit_callbacks
    order, username, key = _provision(client, booking_data, keypair, admin_user, callbacks, "alice")
    try:
        yield order, _hand_over(order, admin_user, callbacks), key
    finally:
        remove_user(admin, username)


def test_the_disk_bandwidth_share_binds_the_tenant_s_writes_and_reads_of_their_home(alice, admin):
    """Red team of issue 33 (F3): the operator's disk bandwidth per lot was --device-read-bps/--device-write-bps on
    the disk that holds the volumes (/dev/vda here) only, but the customer's home is an ext4 file system in a loop
    device: their reads and writes go to /dev/loopN, which no rule named. The loop device the runtime mounted the
    home from is throttled too, in the container's cgroup, at each start."""
    _order, access, key = alice
    assert access.shares["disk_io"] == f"{DISK_MBPS} MB/s"
    template = "{{range .HostConfig.BlkioDeviceWriteBps}}{{.Path}} {{.Rate}}{{end}}"
    rule = admin.run(["podman", "inspect", "--format", template, f"binome-{access.username}"]).stdout.split()
    assert rule and int(rule[-1]) == DISK_MBPS * 2**20  # the runtime holds the operator's share

    # Alice writes then reads 64 MiB of her home, bypassing the page cache (dd says its rate)
    mib = 64
    written = _in(access, key, f"dd if=/dev/zero of=$HOME/big bs=1M count={mib} oflag=direct 2>&1", timeout=120)
    read = _in(access, key, "dd if=$HOME/big of=/dev/null bs=1M iflag=direct 2>&1", timeout=120)
    rates = [_dd_seconds(answer.stdout) for answer in (written, read)]
    print(f"Alice's {mib} MiB, share {DISK_MBPS} MB/s: written in {rates[0]:.2f} s, read in {rates[1]:.2f} s")
    # at her share, 64 MiB take at least 8 s each way (dd's own clock)
    assert min(rates) >= mib / DISK_MBPS * 0.8, (written.stdout, read.stdout)


def _dd_seconds(answer: str) -> float:
    """The seconds dd says it took ("..., 0.0123 s, 2.7 GB/s")."""
    match = re.search(r"copied, ([0-9.,]+) s,", answer)
    assert match, answer
    return float(match[1].replace(",", "."))
