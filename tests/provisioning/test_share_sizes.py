"""A container's share of what the host has one of, derived from the host's size when the operator set nothing:
the connection-tracking table and the pool of terminals split over the host's lots less the host's reserve, a disk
weight only where the kernel honours one."""

from pathlib import Path

import pytest

from provisioning import shares

SIZE = shares.HostSize(
    cpus=64, memory_bytes=512 * 2**30, conntrack_max=262144, pty_max=4096, pty_reserve=1024, io_device="/dev/nvme0n1"
)


@pytest.mark.parametrize(
    ("lots_in_container", "lots_on_host", "connections", "ptys"),
    [(1, 4, 58982, 691), (2, 4, 117964, 1382), (4, 4, 235929, 2764), (1, 1, 235929, 2764)],
)
def test_derived_shares_split_the_host_s_tables_over_its_lots_and_keep_a_reserve(
    lots_in_container, lots_on_host, connections, ptys
):
    share = shares.container_shares(SIZE, lots_in_container=lots_in_container, lots_on_host=lots_on_host)

    assert (share.connections, share.ptys) == (connections, ptys)
    # every tenant at its share leaves the host its reserve
    assert share.connections * lots_on_host / lots_in_container <= SIZE.conntrack_max * shares.HOST_RESERVE
    assert share.ptys * lots_on_host / lots_in_container <= SIZE.ptys_shared * shares.HOST_RESERVE


def test_the_operator_s_shares_win_and_a_disk_weight_is_given_only_where_the_kernel_honours_one():
    share = shares.container_shares(SIZE, lots_in_container=2, lots_on_host=4, connections=9000, ptys=64, disk_mbps=300)
    assert (share.connections, share.ptys, share.io_bps, share.io_device) == (9000, 64, 300 * 2**20, "/dev/nvme0n1")
    assert share.io_weight == 0 and share.disk_io == "300 MB/s"

    weighted = shares.container_shares(
        shares.HostSize(**{**SIZE.__dict__, "io_weight": True}), lots_in_container=2, lots_on_host=4
    )
    assert (weighted.io_weight, weighted.io_bps, weighted.disk_io) == (200, 0, "weight 200")
    bare = shares.HostSize(cpus=8, memory_bytes=2**34)  # no connection tracking, no pty figures read
    untracked = shares.container_shares(bare, lots_in_container=1, lots_on_host=2)
    assert (untracked.connections, untracked.ptys, untracked.disk_io) == (0, 0, "")


@pytest.mark.parametrize(
    ("pid_max", "threads_max", "lots_on_host", "pids"),
    [(32768, 192735, 8, 3686), (32768, 16000, 8, 1800), (4194304, 4194304, 8, 4096), (32768, 0, 1, 4096)],
)
def test_the_process_share_is_the_lots_part_of_the_host_s_pids_and_threads_at_most_4096_a_lot(
    pid_max, threads_max, lots_on_host, pids
):
    size = shares.HostSize(**{**SIZE.__dict__, "pid_max": pid_max, "threads_max": threads_max})
    share = shares.container_shares(size, lots_in_container=1, lots_on_host=lots_on_host)
    assert share.pids_limit == pids
    assert share.pids_limit * lots_on_host <= min(pid_max, threads_max or pid_max) * shares.HOST_RESERVE


def test_the_tenants_process_shares_leave_the_host_processes_of_its_own(admin):
    """Red team of issue 33 (F7): every thread takes a pid, and the share was 4,096 per lot whatever the host's
    kernel.pid_max: on a host of 8 lots whose pid_max is the kernel's 32,768 (this test machine's), the tenants
    together could hold every pid of the host (its sshd, the runtime's conmon, the portal's SSH could not fork). The
    host's size is read as provisioning reads it, over SSH."""
    size = shares.host_size(admin, "/")
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    threads_max = int(Path("/proc/sys/kernel/threads-max").read_text())
    assert (size.pid_max, size.threads_max) == (pid_max, threads_max)
    lots = 8
    share = shares.container_shares(size, lots_in_container=1, lots_on_host=lots)
    print(f"pid_max {pid_max}: {lots} lots × {share.pids_limit} processes = {lots * share.pids_limit}")
    assert lots * share.pids_limit <= min(pid_max, threads_max) * shares.HOST_RESERVE
