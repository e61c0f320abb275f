"""What tenants share, tried as a hostile tenant who stays inside their container but uses what every container of
the host draws from (issue 33): the kernel's connection-tracking table, the pool of terminals, the container's own
restarts; and root inside the container, which is the customer's, reaching for the host and the other tenant. Two
orders on one host, against the real sshd on loopback, podman with runc (user namespaces), the test image."""

# ruff: noqa: F811 (the fixtures of two customers on one host come from tests/provisioning/tenants.py)

import os
import secrets
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from booking.models import OrderStatus
from inventory.models import Host
from provisioning import restarts, runs, shares
from provisioning.models import Access, ProvisioningRun
from tests.builders.containers import _build_marker_library, _in, _provision
from tests.provisioning.conftest import customer_ssh, customer_ssh_options, tenant_processes
from tests.provisioning.tenants import outside_server, provisioned_pair, two_customers  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

# What the derived shares are on this test host (two lots): its table and pool split over them, less the reserve.
TABLE = int(Path("/proc/sys/net/netfilter/nf_conntrack_max").read_text())
PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())
THREADS_MAX = int(Path("/proc/sys/kernel/threads-max").read_text())
PTY_POOL = int(Path("/proc/sys/kernel/pty/max").read_text()) - int(Path("/proc/sys/kernel/pty/reserve").read_text())


def _page(client, order) -> str:
    return client.get(reverse("customer:order", kwargs={"public_id": order.public_id, "token": order.token})).content


def _address(access, key) -> str:
    return _in(access, key, "hostname -I").stdout.split()[0]


def _tracked_from(address: str) -> int:
    """The host's connection-tracking entries opened from `address` (the first src= of a line is the original
    direction's: a connection into the container names it in its reply direction only)."""
    needle = f"src={address}".encode()
    with open("/proc/net/nf_conntrack", "rb") as table:
        return sum(1 for line in table if line.split(b" src=", 1)[-1].startswith(needle[4:] + b" "))


FLOOD = """
import socket, sys
target, flows = sys.argv[1], int(sys.argv[2])
sent = 0
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for port in range(1, flows + 1):  # a new flow per destination port (and per source port past 65535)
    if port % 65535 == 0:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"x", (target, port % 65535 + 1))
    sent += 1
print(sent)
"""
CAP = 6000  # the operator's cap per lot on this host: reached well within the 30 s an unanswered UDP flow is tracked


@pytest.fixture
def capped_host(container_host):
    """The test host with the operator's share of tracked connections (the derived one is the table split over the
    lots: shown by the host check's test below)."""
    Host.objects.filter(pk=container_host.pk).update(connections_per_lot=CAP)
    return container_host


def _dropped_over_cap(bridge: str) -> int:
    """Packets the firewall dropped for being over the caps of `bridge` (iptables' counters of its chain's rules)."""
    listed = subprocess.run(
        ["iptables", "-w", "10", "-t", "mangle", "-L", f"{shares.CONNTRACK_CHAIN}-{bridge}", "-v", "-x", "-n"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return sum(int(line.split()[0]) for line in listed.stdout.splitlines() if " DROP " in f" {line} ")


def test_one_tenant_opening_flows_past_its_cap_is_stopped_there_and_the_other_logs_in_and_downloads(
    capped_host, two_customers, outside_server, admin, tmp_path
):
    (_a, alice, alice_key), (_b, bob, bob_key) = two_customers
    assert alice.shares["connections"] == CAP
    outside, _namespace = outside_server
    target = outside.split(":")[0]
    alice_address = _address(alice, alice_key)
    network = f"binome-{alice.username}"
    bridge = admin.run(["podman", "network", "inspect", "--format", "{{.NetworkInterface}}", network]).stdout.strip()

    # Alice sends new UDP flows to the outside, one per port: four times her share
    flood = _in(alice, alice_key, f"python3 - {target} {4 * CAP}", input=FLOOD, timeout=300)
    assert int(flood.stdout) == 4 * CAP

    # the kernel tracked her flows up to her cap of open flows and not one more (the rest of her share is kept for
    # the TCP flows the table keeps once closed: nodekit/binome-guard): the rest were dropped before they took a place
    tracked = _tracked_from(alice_address)
    print(f"Alice's UDP flows tracked: {tracked} (share {CAP}, open at once {shares.open_flows(CAP)})")
    assert shares.open_flows(CAP) * 0.95 <= tracked <= shares.open_flows(CAP), tracked
    assert _dropped_over_cap(bridge) >= 2 * CAP
    # while her flows fill her share, Bob logs in and downloads, and the portal's own SSH to the host works
    payload = secrets.token_hex(100_000)
    _in(bob, bob_key, "cat > ~/results.bin", input=payload)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(bob.known_hosts_line + "\n")
    fetched = subprocess.run(
        ["scp", *customer_ssh_options(bob_key, known_hosts), "-P", str(bob.ssh_port),
         f"{bob.username}@127.0.0.1:results.bin", str(tmp_path / "results.bin")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "results.bin").read_text() == payload
    assert admin.run(["true"]).ok
    print(f"while Alice held her share, Bob logged in and downloaded {len(payload)} bytes over scp")


PTYS = """
import os, sys, time
# a process holds at most its nofile limit of descriptors: several processes take terminals until one is refused
counts, errors = [], set()
for _ in range(4):
    reader, writer = os.pipe()
    if os.fork() == 0:
        os.close(reader)
        held = []
        try:
            while True:
                held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
        except OSError as exc:
            os.write(writer, f"{len(held)} {exc.errno}".encode())
            os.close(writer)
        time.sleep(120)
        os._exit(0)
    os.close(writer)
    count, errno = os.read(reader, 100).split()
    counts.append(int(count))
    errors.add(int(errno))
    if int(errno) == 28:
        break
print(sum(counts), " ".join(map(str, sorted(errors))), flush=True)
sys.stdout.close()
time.sleep(120)
"""


def test_one_tenant_holding_every_terminal_it_can_leaves_the_other_its_ssh_t(two_customers, admin):
    (_a, alice, alice_key), (_b, bob, bob_key) = two_customers
    cap = alice.shares["ptys"]
    assert cap == int(PTY_POOL * shares.HOST_RESERVE / 2)
    # Alice opens terminals until her container refuses one, and keeps them all open
    holder = subprocess.Popen(
        ["ssh", *customer_ssh_options(alice_key, _known_hosts(alice)), "-p", str(alice.ssh_port),
         f"{alice.username}@127.0.0.1", "python3 -"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        holder.stdin.write(PTYS)
        holder.stdin.close()
        held, *errors = map(int, holder.stdout.readline().split())
        assert cap - 2 <= held <= cap and 28 in errors, (held, errors)  # ENOSPC: her instance is full at her share
        # Bob still gets a terminal: a login shell, as tmux or VS Code would ask
        shell = customer_ssh(bob, bob_key, None, options=["-tt"], input="tty; exit\n")
        assert shell.returncode == 0 and "/dev/pts/" in shell.stdout, shell.stderr
        assert "PTY allocation request failed" not in shell.stderr
        # the share binds Alice alone: her own next terminal is the one refused
        hers = customer_ssh(alice, alice_key, None, options=["-tt"], input="tty; exit\n")
        assert "PTY allocation request failed" in hers.stderr
    finally:
        holder.kill()
        holder.wait(timeout=10)


def _known_hosts(access) -> Path:
    path = Path(f"/tmp/known_hosts-shares-{access.pk}")  # noqa: S108 (the test's own file)
    path.write_text(access.known_hosts_line + "\n")
    return path


def _state(admin, access) -> str:
    template = "{{.State.Status}}"
    return admin.run(["podman", "inspect", "--format", template, f"binome-{access.username}"]).stdout.strip()


def _kill_1(admin, access, key) -> None:
    """The customer, root in their container, kills its main process: the container stops."""
    customer_ssh(access, key, "kill 1", user="root")
    for _attempt in range(100):
        if _state(admin, access) != "running":
            return
        subprocess.run(["sleep", "0.1"], check=True)
    raise AssertionError("the container did not stop")


def test_kill_1_in_a_loop_is_restarted_with_backoff_then_left_stopped_and_the_operators_told(
    two_customers, admin, client, operator, settings, mailoutbox, django_capture_on_commit_callbacks
):
    callbacks = django_capture_on_commit_callbacks
    settings.ADMINS = [("Olga", "olga@ops.example.org")]
    (order, alice, alice_key), (_b, bob, bob_key) = two_customers
    config = admin.run(
        ["podman", "inspect", "--format", "{{.HostConfig.RestartPolicy.Name}}", f"binome-{alice.username}"]
    )
    assert config.stdout.strip() == "no"  # the runtime never restarts it by itself

    def watch(now):
        with callbacks(execute=True):
            return restarts.containers_watch(now=now)

    start = timezone.now()
    decisions = []
    moment = start
    for restart in range(1, restarts.RESTART_LIMIT + 1):
        _kill_1(admin, alice, alice_key)
        if restart > 1:  # too soon after the last restart: left stopped, however often the watch looks
            decisions.append(watch(moment + restarts.restart_delay(restart - 1) - timedelta(seconds=1)))
            assert _state(admin, alice) != "running"
            moment += restarts.restart_delay(restart - 1)
        decisions.append(watch(moment))
        assert _state(admin, alice) == "running"
        assert customer_ssh(alice, alice_key, "true").returncode == 0  # back, with sshd answering
    assert [decision.get("restarted", 0) for decision in decisions] == [1] + [0, 1] * (restarts.RESTART_LIMIT - 1)
    assert all(decision.get("running") == 1 for decision in decisions)  # Bob's container ran all along

    # the sixth stop in a row: held, not restarted, and the operators told once
    _kill_1(admin, alice, alice_key)
    assert watch(moment + timedelta(hours=1)).get("held") == 1
    assert watch(moment + timedelta(hours=2)).get("held") is None  # no longer watched: nothing more is done
    assert _state(admin, alice) != "running"
    # a change of keys from the order page (which rewrites them and waits for sshd) does not start it either
    with callbacks(execute=True):
        keys = runs.access_keys_renew(order=order)
    keys.refresh_from_db()
    assert keys.status == ProvisioningRun.Status.FAILED and "left stopped" in keys.error
    assert _state(admin, alice) != "running"
    told = [mail for mail in mailoutbox if order.public_id in mail.subject and "keeps stopping" in mail.subject]
    assert len(told) == 1 and told[0].to == ["olga@ops.example.org"]
    runs_made = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.RESTART)
    assert runs_made.count() == restarts.RESTART_LIMIT
    assert all(run.status == ProvisioningRun.Status.SUCCEEDED for run in runs_made)
    assert customer_ssh(bob, bob_key, "true").returncode == 0

    # the customer's page and the console say so; the operator starts it again from the console
    assert "left stopped and our operators are told" in " ".join(_page(client, order).decode().split())
    client.force_login(operator)
    console = client.get(reverse("console:order", kwargs={"public_id": order.public_id})).content.decode()
    assert "left stopped since" in console and "Start the container again" in console
    with callbacks(execute=True):
        response = client.post(reverse("console:action", kwargs={"public_id": order.public_id, "action": "restart"}))
    assert response.status_code == 302
    alice.refresh_from_db()
    assert alice.restarts_held_at is None and alice.restarts == 0
    assert _state(admin, alice) == "running"
    assert customer_ssh(alice, alice_key, "true").returncode == 0


ESCAPE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static void tried(const char *what, int result) {
    printf("%s %s\n", what, result == 0 ? "DONE" : strerror(errno));
}

int main(int argc, char **argv) {
    const char *marker = argv[1];  /* a path of the host's own /tmp */
    int bob = atoi(argv[2]);       /* the host pid of the other tenant's container */
    char path[512];
    int fd;
    /* Shocker: a file handle of the host's root file system, opened by handle (CAP_DAC_READ_SEARCH) */
    struct { struct file_handle handle; unsigned char bytes[8]; } shocker = {{8, 1}, {2, 0, 0, 0, 0, 0, 0, 0}};
    fd = open("/", O_RDONLY);
    tried("open_by_handle_at", open_by_handle_at(fd, &shocker.handle, O_RDONLY) >= 0 ? 0 : -1);
    /* the host's kernel settings and cgroups */
    fd = open("/proc/sys/kernel/core_pattern", O_WRONLY);
    tried("core_pattern", fd >= 0 && write(fd, "|/tmp/x", 7) == 7 ? 0 : -1);
    fd = open("/sys/fs/cgroup/memory/release_agent", O_WRONLY);
    tried("release_agent", fd >= 0 ? 0 : -1);
    tried("mount_cgroup", mount("cgroup", "/tmp", "cgroup", 0, "memory"));
    tried("mount_tmpfs_over_etc", mount("tmpfs", "/etc", "tmpfs", 0, ""));
    tried("mknod_host_disk", mknod("/tmp/disk", S_IFBLK | 0600, makedev(254, 0)));
    /* the host's files by path, and through the other tenant's processes */
    fd = open(marker, O_WRONLY | O_CREAT, 0644);
    tried("write_marker_path", fd >= 0 ? 0 : -1);
    snprintf(path, sizeof path, "/proc/%d/root/tmp/escaped", bob);
    fd = open(path, O_WRONLY | O_CREAT, 0644);
    tried("write_through_other_tenant", fd >= 0 ? 0 : -1);
    tried("signal_other_tenant", kill(bob, 0));
    tried("etc_ld_so_preload", (fd = open("/etc/ld.so.preload", O_WRONLY | O_CREAT, 0644)) >= 0 ? 0 : -1);
    return 0;
}
"""


def test_root_in_the_container_writes_no_host_file_and_sees_no_other_tenant(two_customers, admin, tmp_path):
    (_a, alice, alice_key), (_b, bob, _bob_key) = two_customers
    marker = f"/tmp/binome-root-escaped-{secrets.token_hex(4)}"  # noqa: S108 (the host's /tmp)
    library = _build_marker_library(tmp_path, marker)
    source = tmp_path / "escape.c"
    source.write_text(ESCAPE)
    binary = tmp_path / "escape"
    subprocess.run(["gcc", "-O1", "-o", str(binary), str(source)], check=True, capture_output=True)
    # the attacker's tools work: on the host, as root, the library writes its marker and the binary does harm
    subprocess.run(["/bin/true"], env={**os.environ, "LD_PRELOAD": str(library)}, check=True)
    assert Path(marker).exists()
    Path(marker).unlink()

    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(alice.known_hosts_line + "\n")
    for local, remote in ((library, "x.so"), (binary, "escape")):
        copied = subprocess.run(
            ["scp", *customer_ssh_options(alice_key, known_hosts), "-P", str(alice.ssh_port), str(local),
             f"root@127.0.0.1:/home/{alice.username}/{remote}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert copied.returncode == 0, copied.stderr
    bob_pid = admin.run(["podman", "inspect", "--format", "{{.State.Pid}}", f"binome-{bob.username}"]).stdout.strip()
    home = f"/home/{alice.username}"

    # root in Alice's container: the library preloaded into root's processes, and every classic escape tried
    attempt = customer_ssh(
        alice, alice_key,
        f"id -u; chmod 755 {home}/escape; LD_PRELOAD={home}/x.so {home}/escape {marker} {bob_pid}; "
        f"cp /bin/sh {home}/rootshell && chmod 4755 {home}/rootshell && echo setuid-made; "
        "ls /home; ps -e -o pid=,comm= | wc -l",
        user="root",
    )  # fmt: skip
    assert attempt.returncode == 0, attempt.stderr
    lines = attempt.stdout.splitlines()
    assert lines[0] == "0"  # root, in the container
    refused = ("open_by_handle_at", "core_pattern", "release_agent", "mount_cgroup", "mount_tmpfs_over_etc",
               "mknod_host_disk", "write_through_other_tenant", "signal_other_tenant", "etc_ld_so_preload")  # fmt: skip
    said = dict(line.split(" ", 1) for line in lines if line.split(" ", 1)[0] in refused)
    assert set(said) == set(refused), lines
    assert "DONE" not in said.values(), said
    assert "setuid-made" in lines and lines[-2] == alice.username  # the only home is hers

    # then: nothing of it on the host, whose kernel settings are as they were
    assert not Path(marker).exists()  # the marker went to the container's own /tmp
    assert "|/tmp/x" not in Path("/proc/sys/kernel/core_pattern").read_text()
    # the setuid root shell she made is owned, on the host, by an unprivileged id of her range
    alice_pid = admin.run(["podman", "inspect", "--format", "{{.State.Pid}}", f"binome-{alice.username}"]).stdout
    owner = int(admin.run(["stat", "-c", "%u", f"/proc/{alice_pid.strip()}/root{home}/rootshell"]).stdout)
    base = int(admin.run(["sh", "-c", f"grep '^{alice.username}:' /etc/subuid | cut -d: -f2"]).stdout)
    assert owner == base and owner >= 100000
    # her root's processes are hers only: ids of her range on the host, none of Bob's
    assert all(int(line.split()[0]) >= base for line in tenant_processes(admin, alice.username) if line.split())
    assert not set(tenant_processes(admin, alice.username)) & set(tenant_processes(admin, bob.username))


FAKE_PYTHON = (
    '#!/bin/sh\necho \'{"schema": "binome.preflight/1", "checks": [{"name": "gpu_visible", "status": "PASS"}], '
    '"summary": {"status": "PASS", "passed": 1, "failed": 0}}\'\nexit 3\n'
)


@pytest.fixture
def image_with_a_lying_check(test_image):
    """The test image with a python3 that prints a passing report and exits in failure."""
    tag = f"localhost/binome-test-lying:{secrets.token_hex(4)}"
    name = f"binome-make-{secrets.token_hex(4)}"
    podman = ["podman", "--runtime", "runc"]
    ulimits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
    script = 'printf "%s" "$FAKE" > /usr/local/bin/python3 && chmod 755 /usr/local/bin/python3'
    subprocess.run(
        [*podman, "run", "--name", name, *ulimits, "--env", f"FAKE={FAKE_PYTHON}", test_image, "sh", "-c", script],
        check=True,
    )
    subprocess.run(["podman", "commit", "--quiet", name, tag], check=True, capture_output=True)
    subprocess.run(["podman", "rm", name], check=True, capture_output=True)
    yield tag
    subprocess.run(["podman", "rmi", "--force", tag], check=False, capture_output=True)


def test_the_pre_flight_runs_with_nothing_of_the_customer_s_and_a_re_run_beside_them_is_their_word(
    two_customers, client, operator, admin_user, admin, django_capture_on_commit_callbacks
):
    (order, alice, alice_key), _bob = two_customers
    # before the hand-over: nothing of the customer's ran, the host looked
    assert alice.preflight_report["beside_customer"] is False
    provision = order.provisioning_runs.get(kind=ProvisioningRun.Kind.PROVISION)
    assert "with nothing of the customer's running" in provision.steps.get(host=alice.host, name="preflight").output
    page = _page(client, order).decode()
    assert "The customer's word" not in page

    # a re-run in the ready window, while the customer has a process of theirs in the container
    _in(alice, alice_key, "(setsid sleep 600 </dev/null >/dev/null 2>&1 &)")
    with django_capture_on_commit_callbacks(execute=True):
        runs.preflight_rerun(order=order, actor=admin_user)
    alice.refresh_from_db()
    assert alice.preflight_report["beside_customer"] is True
    for language, words in (("en", "The customer's word"), ("fr", "La parole du client")):
        client.cookies["django_language"] = language
        assert words in _page(client, order).decode().replace("’", "'")
        client.force_login(operator)
        console = client.get(reverse("console:order", kwargs={"public_id": order.public_id})).content.decode()
        assert words in console.replace("’", "'")
        client.logout()


def test_a_check_that_fails_is_a_failure_whatever_report_it_prints(
    client, container_host, booking_data, keypair, admin_user, admin, image_with_a_lying_check,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    from booking.models import EnvironmentImage
    from tests.provisioning.conftest import remove_user

    EnvironmentImage.objects.update(image_ref=image_with_a_lying_check)
    order, username, _key = _provision(
        client, booking_data, keypair, admin_user, django_capture_on_commit_callbacks, "liar"
    )
    try:
        access = Access.objects.get(order=order)
        assert order.status == OrderStatus.PROVISIONING_FAILED  # the hand-over waits for an operator
        assert access.preflight_status == "FAIL"
        exit_check = [check for check in access.preflight_report["checks"] if check["name"] == "exit_status"]
        assert exit_check == [{"name": "exit_status", "status": "FAIL", "reason": "exit status 3, report PASS"}]
    finally:
        remove_user(admin, username)


def test_the_order_page_and_the_host_check_give_each_container_s_shares(two_customers, client, container_host, admin):
    from provisioning.hosts import host_check_run

    (order, alice, _key), (_b, bob, _bob_key) = two_customers
    page = _page(client, order).decode()
    connections, ptys = alice.shares["connections"], alice.shares["ptys"]
    # derived from the host's size: its connection-tracking table and its pool of terminals, split over its two lots
    assert (connections, ptys) == (int(TABLE * shares.HOST_RESERVE / 2), int(PTY_POOL * shares.HOST_RESERVE / 2))
    assert f"{connections} places in its table of connections (open or just closed) and {ptys} terminals" in page
    assert f"ssh -p {alice.ssh_port} {alice.username}@127.0.0.1" in page and "Log in as <code>root</code>" in page

    host_check_run(host_id=container_host.pk, actor_id=None)
    report = Host.objects.get(pk=container_host.pk).isolation_report
    pids = alice.shares["pids"]  # the host's pids and threads split over its two lots, at most 4,096 a lot
    assert pids == min(shares.PIDS_PER_LOT, int(min(PID_MAX, THREADS_MAX) * shares.HOST_RESERVE / 2))
    assert f"{PID_MAX} pids (threads-max {THREADS_MAX})" in report and "WARNING processes" not in report
    for access in (alice, bob):
        line = next(line for line in report.splitlines() if line.startswith(f"binome-{access.username}:"))
        assert f"{pids} processes, terminals {ptys}, tracked connections {connections} (" in line
        assert "user namespace 0:" in line and "restart policy no" in line
    assert "runc 1.1.5" in report and "CVE-2024-21626" in report and "CVE-2019-5736" in report
    assert not [line for line in report.splitlines() if line.startswith("user namespaces:")]  # disjoint ranges
