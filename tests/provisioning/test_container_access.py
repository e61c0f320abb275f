"""The tenant boundary, tried as two customers on one host would: each logs in to the SSH server of their own
container (its port on the host, its host key from the order page), with their lot's GPUs, shares and data volume;
what they write is never read or run by the host; neither reaches the other's ports, sockets or the host's loopback;
no key works before the hand-over; after teardown nothing of theirs is left. Against the real sshd on loopback (the
host's, which the customers never pass through), real podman with runc, mknod stand-ins for /dev/nvidia0..3."""

import html
import os
import platform
import re
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from django.urls import reverse

from booking.models import OrderStatus
from inventory.models import Lot
from provisioning import runs
from provisioning.models import Access, ProvisioningRun
from tests.builders.containers import _build_marker_library, _hand_over, _in, _provision
from tests.provisioning.conftest import customer_ssh, customer_ssh_options, remove_user, tenant_processes
from tests.provisioning.customer_ssh import researcher_account
from tests.provisioning.tenants import outside_server, provisioned_pair, two_customers  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def test_no_key_works_before_the_hand_over_and_nothing_of_the_customer_runs_until_then(
    provisioned_pair,  # noqa: F811
    admin,
    admin_user,
    container_sshd,
    django_capture_on_commit_callbacks,
):
    order, username, private_key = provisioned_pair[0]
    assert order.status == OrderStatus.PROVISIONING_FAILED  # the pre-flight failed: an operator decides
    access = Access.objects.select_related("host").get(order=order)
    assert access.ssh_port and access.known_hosts_line, order.provisioning_runs.first().error  # made already
    # the customer tries their key on the container's port and on the host's own sshd: neither lets them in
    assert customer_ssh(access, private_key, "true").returncode != 0
    assert container_sshd.login_as(username, private_key, "true").returncode != 0
    # inside the container only what provisioning started runs: no sshd, no process a customer could have left
    listed = admin.run(["podman", "exec", f"binome-{username}", "ps", "-eo", "comm="]).stdout.split()
    assert "sshd" not in listed and set(listed) <= {"catatonit", "podman-init", "sh", "sleep", "ps"}, listed

    access = _hand_over(order, admin_user, django_capture_on_commit_callbacks)
    assert _in(access, private_key, "id -un").stdout.strip() == username
    handover = order.provisioning_runs.get(kind=ProvisioningRun.Kind.KEYS)
    assert [step.name for step in handover.steps.all()] == ["connect", "install_keys", "start_ssh"]
    # the host's sshd still refuses the customer: their account has no shell, no key and no home of theirs
    assert container_sshd.login_as(username, private_key, "true").returncode != 0
    account = admin.run(["getent", "passwd", username]).stdout.strip().split(":")
    assert account[6] == "/usr/sbin/nologin"
    assert admin.run(["stat", "-c", "%U %a", account[5]]).stdout.split() == ["root", "755"]


CGROUP_PROBE = (
    "if [ -f /sys/fs/cgroup/cpu.max ]; then cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/memory.max "
    "/sys/fs/cgroup/pids.max; else echo $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) "
    "$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us); cat /sys/fs/cgroup/memory/memory.limit_in_bytes "
    "/sys/fs/cgroup/pids/pids.max; fi; df -k --output=size /dev/shm | tail -1; df -k --output=size ~ | tail -1"
)


def test_each_login_lands_in_its_own_container_with_its_gpus_and_its_limits_probed_from_inside(two_customers):  # noqa: F811
    for _order, access, private_key in two_customers:
        probe = (
            "hostname; id -un; ls /dev | grep '^nvidia' | tr '\\n' ' '; echo; ls /home; "
            "grep ^CapEff /proc/self/status; grep -c sshd /proc/1/cmdline"
        )
        lines = _in(access, private_key, probe).stdout.splitlines()
        own = " ".join(f"nvidia{index}" for index in access.gpu_indices.split(",")) + " "
        # its own container, as its own user, its lot's two GPUs and no other, its own home, no capability
        assert lines == [
            f"binome-{access.username}",
            access.username,
            own,
            access.username,
            "CapEff:\t0000000000000000",
            "1",  # the container's main process is the supervisor of the customer's sshd
        ]
        # the limits as the kernel applies them inside: 1.5 CPUs, 2 GiB, 4096 processes, 1 GiB /dev/shm, 1 GiB disk
        limits = _in(access, private_key, CGROUP_PROBE).stdout.split()
        assert limits[:4] == ["150000", "100000", str(2 * 2**30), "4096"], limits
        assert int(limits[4]) == 2**20  # /dev/shm, KiB
        assert 0.8 * 2**20 < int(limits[5]) <= 2**20  # the data volume (ext4 of 1 GiB), KiB
        # the pre-flight ran inside the container, from the image pinned by ID
        assert access.preflight_report["hostname"] == f"binome-{access.username}"
        assert access.preflight_report["image"]["id"] == f"sha256:{access.image_id}"
        assert len(access.image_id) == 64 and access.disk_gib == 1
    assert {access.gpu_indices for _o, access, _k in two_customers} == {"0,1", "2,3"}


def test_what_the_customer_writes_for_the_host_s_login_stack_never_runs_on_the_host(
    two_customers,  # noqa: F811
    container_sshd,
    admin,
    admin_user,
    tmp_path,
    django_capture_on_commit_callbacks,
):
    order, access, private_key = two_customers[0]
    marker = f"/tmp/binome-escaped-{secrets.token_hex(4)}"  # noqa: S108 (the host's /tmp; the container has its own)
    library = _build_marker_library(tmp_path, marker)
    # the payload works: loaded on the host, it writes the marker there
    subprocess.run(["/bin/true"], env={**os.environ, "LD_PRELOAD": str(library)}, check=True)
    assert Path(marker).exists()
    Path(marker).unlink()

    # the attacker plants every file a host's login stack could read: a PAM environment preloading the library,
    # user units, shell rc files, ~/.ssh/rc, ~/.forward, ~/.k5login, and a home full of symlinks to host files
    home = f"/home/{access.username}"
    options = ["-P", str(access.ssh_port), *customer_ssh_options(private_key, tmp_path / "kh")]
    (tmp_path / "kh").write_text(access.known_hosts_line + "\n")
    copied = subprocess.run(
        ["scp", *options, str(library), f"{access.username}@127.0.0.1:x.so"], capture_output=True, text=True
    )
    assert copied.returncode == 0, copied.stderr
    plant = (
        f"cd && printf 'LD_PRELOAD DEFAULT={home}/x.so\\n' > .pam_environment && "
        "mkdir -p .config/systemd/user/default.target.wants .ssh && "
        f"printf '[Service]\\nExecStart=/bin/touch {marker}\\n[Install]\\nWantedBy=default.target\\n' "
        "> .config/systemd/user/escape.service && "
        "ln -sf ../escape.service .config/systemd/user/default.target.wants/escape.service && "
        f"for f in .bashrc .profile .bash_profile .ssh/rc .forward .k5login; do echo 'touch {marker}' > $f; done && "
        "ln -s /etc/shadow shadow && ln -s /root rootdir && ln -s /etc/sudoers.d sudoers.d && echo planted"
    )
    assert _in(access, private_key, plant).stdout.strip() == "planted"

    # logins of every kind: to the container (shell, command, sftp), and to the host's own sshd with the same key
    # and the library asked for through the environment
    assert _in(access, private_key, "true").returncode == 0
    _in(access, private_key, None, input="exit\n", options=["-tt"])
    assert (
        subprocess.run(
            ["sftp", *options, "-b", "-", f"{access.username}@127.0.0.1"], input="ls\n", capture_output=True, text=True
        ).returncode
        == 0
    )
    for extra in ([], ["-o", f"SetEnv=LD_PRELOAD={home}/x.so"]):
        refused = container_sshd.login_as(access.username, private_key, "true", options=extra)
        assert refused.returncode != 0
    # and every run root makes on the host for this order, before and after the window
    with django_capture_on_commit_callbacks(execute=True):
        runs.preflight_rerun(order=order, actor=admin_user)
        runs.access_keys_renew(order=order, actor=admin_user)
    with django_capture_on_commit_callbacks(execute=True):
        runs.teardown_start(order=order, actor=admin_user, reason="test")
    with django_capture_on_commit_callbacks(execute=True):
        runs.access_wipe_start(order=order, actor=admin_user)
    assert {run.kind: run.status for run in order.provisioning_runs.all()} == {
        kind: ProvisioningRun.Status.SUCCEEDED for kind in ("provision", "preflight", "keys", "teardown", "wipe")
    }

    assert not Path(marker).exists()  # nothing of the customer's ran on the host
    uid = access.preflight_report.get("uid") or admin.run(["id", "-u", "nobody"]).stdout.strip()
    assert not admin.run(["sh", "-c", f"ls /run/user/{uid} /var/lib/systemd/linger/{access.username}"], check=False).ok
    assert admin.run(["stat", "-c", "%U", "/etc/shadow", "/root"]).stdout.split() == ["root", "root"]
    assert not admin.run(["id", access.username], check=False).ok  # wiped: the account is gone too


@pytest.fixture
def host_loopback_server():
    """A server on the host's 127.0.0.1 (the portal, a metrics agent, a database: the host's own)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    yield server.getsockname()[1]
    server.close()


def test_tenants_reach_neither_each_other_nor_the_host_but_the_outside_world_yes(
    two_customers,  # noqa: F811
    host_loopback_server,
    outside_server,  # noqa: F811
    admin,
):
    (_a, alice, alice_key), (_b, bob, bob_key) = two_customers
    # bob serves on his 127.0.0.1 and on all his addresses, and listens on an abstract unix socket
    serve = (
        "cd && echo bob-secret > index.html && "
        "(setsid python3 -m http.server 8765 --bind 0.0.0.0 </dev/null >/dev/null 2>&1 &) && "
        "(setsid python3 -c \"import socket,time; s=socket.socket(socket.AF_UNIX); s.bind('\\0bob-abstract'); "
        's.listen(); time.sleep(120)" </dev/null >/dev/null 2>&1 &) && sleep 1 && hostname -I'
    )
    bob_address = _in(bob, bob_key, serve).stdout.split()[0]
    assert (
        _in(
            bob,
            bob_key,
            "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8765/').read().decode())\"",
        ).stdout.strip()
        == "bob-secret"
    )

    # a third tenant's container stops (netavark 1.4 then drops its own isolation rule until another one starts):
    # the portal's guard must hold without it
    third = f"binome-test-third-{secrets.token_hex(3)}"
    podman = ["podman", "--runtime", "runc"]
    admin.run([*podman, "network", "create", "--opt", "isolate=true", third])
    ulimits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
    admin.run([*podman, "run", "--rm", "--network", third, *ulimits, alice.image_id, "true"], timeout=120)
    admin.run(["podman", "network", "rm", third])
    # and netavark's accepting rules sit above everything in the filter table, as on a fresh host or after a boot,
    # where netavark makes its chains after the guard ran: the guard must not depend on the order
    admin.run(["iptables", "-I", "FORWARD", "1", "-j", "NETAVARK_FORWARD"])
    network = f"binome-{alice.username}"
    template = "{{range .Subnets}}{{.Gateway}}{{end}}"
    gateway = admin.run(["podman", "network", "inspect", "--format", template, network]).stdout.strip()
    outside, outside_namespace = outside_server
    bridge = admin.run(["podman", "network", "inspect", "--format", "{{.NetworkInterface}}", network]).stdout.strip()
    link_local = admin.run(["ip", "-6", "-o", "addr", "show", "dev", bridge, "scope", "link"]).stdout.split()
    bridge_v6 = link_local[link_local.index("inet6") + 1].split("/")[0] if "inet6" in link_local else "fe80::1"
    host_v6_server = socket.create_server(("::", 0), family=socket.AF_INET6)  # a host service on every v6 address
    route = admin.run(["ip", "-4", "route", "get", "192.0.2.1"]).stdout.split()
    own_address = route[route.index("src") + 1] if "src" in route else "127.0.0.1"  # this machine's, not loopback
    own_server = socket.create_server((own_address, 0))  # a host service on a public address (an exporter...)
    targets = {
        "bob_loopback": "127.0.0.1:8765",
        "bob_address": f"{bob_address}:8765",
        "bob_ssh_through_the_host": f"{gateway}:{bob.ssh_port}",
        "host_loopback": f"127.0.0.1:{host_loopback_server}",
        "host_loopback_via_gateway": f"{gateway}:{host_loopback_server}",
        "host_public_service": f"{own_address}:{own_server.getsockname()[1]}",
        "host_ipv6_link_local": f"{bridge_v6}%eth0:{host_v6_server.getsockname()[1]}",
        "outside": outside,
    }
    try:
        arguments = " ".join(f"{name}={target}" for name, target in targets.items())
        answer = _in(alice, alice_key, f"python3 - {arguments}", input=REACH_PROBE)
    finally:
        admin.run(["iptables", "-D", "FORWARD", "-j", "NETAVARK_FORWARD"])  # the copy put above
        own_server.close()
        host_v6_server.close()
    reached = dict(line.split(" ", 1) for line in answer.stdout.splitlines())
    assert reached.pop("outside") == "reached"  # outbound traffic leaves the container's network
    assert reached == dict.fromkeys([*list(targets)[:7], "bob_abstract_socket"], "refused"), reached
    # and from the outside, a machine routed through the host reaches no container port that is not published
    direct = subprocess.run(
        ["ip", "netns", "exec", outside_namespace, "python3", "-", f"bob_direct={bob_address}:8765"],
        input=REACH_PROBE,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert direct.stdout.splitlines()[0] == "bob_direct refused", direct.stdout + direct.stderr


REACH_PROBE = """
import socket, sys
for argument in sys.argv[1:]:
    name, target = argument.split("=")
    host, port = target.rsplit(":", 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        address = socket.getaddrinfo(host, int(port), family, socket.SOCK_STREAM)[0][4]
        with socket.socket(family, socket.SOCK_STREAM) as connection:
            connection.settimeout(3)
            connection.connect(address)
        print(name, "reached")
    except OSError:
        print(name, "refused")
sock = socket.socket(socket.AF_UNIX)
try:
    sock.connect("\\0bob-abstract")
    print("bob_abstract_socket reached")
except OSError:
    print("bob_abstract_socket refused")
"""


def test_files_move_with_scp_sftp_and_rsync_and_local_and_dynamic_forwards_reach_the_container_only(
    two_customers,  # noqa: F811
    host_loopback_server,
    tmp_path,
):
    _order, access, private_key = two_customers[0]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(access.known_hosts_line + "\n")
    options = customer_ssh_options(private_key, known_hosts)
    target = f"{access.username}@127.0.0.1"
    port = str(access.ssh_port)
    payload = tmp_path / "weights.bin"
    payload.write_bytes(os.urandom(300_000))

    def run(argv, **kwargs):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kwargs)
        assert result.returncode == 0, f"{argv[0]}: {result.stderr}"
        return result

    run(["scp", *options, "-P", port, str(payload), f"{target}:weights.bin"])
    run(["scp", *options, "-P", port, f"{target}:weights.bin", str(tmp_path / "back.bin")])
    assert (tmp_path / "back.bin").read_bytes() == payload.read_bytes()
    listed = run(
        ["sftp", *options, "-P", port, "-b", "-", target],
        input=f"mkdir runs\nput {payload} runs/c.bin\nls runs\nls /opt\n",
    )
    assert "c.bin" in listed.stdout and "binome" in listed.stdout  # the container's files: its /opt holds the kit
    run(["rsync", "-a", "-e", " ".join(["ssh", *options, "-p", port]), str(payload), f"{target}:synced.bin"])
    sums = _in(access, private_key, "cd && sha256sum weights.bin runs/c.bin synced.bin")
    assert len({line.split()[0] for line in sums.stdout.splitlines()}) == 1, sums.stdout

    # Jupyter or TensorBoard in the container, on its own 127.0.0.1: reached with -L and with -D (VS Code)
    _in(access, private_key, "cd && echo served-from-container > index.html && "
        "(setsid python3 -m http.server 8888 --bind 127.0.0.1 </dev/null >/dev/null 2>&1 &) && sleep 1")  # fmt: skip
    local = socket.create_server(("127.0.0.1", 0))
    local_port = local.getsockname()[1]
    local.close()
    forwards = [
        ["-L", f"127.0.0.1:{local_port}:localhost:8888"],
        ["-D", f"127.0.0.1:{local_port}"],
        ["-L", f"127.0.0.1:{local_port}:127.0.0.1:{host_loopback_server}"],  # the host's loopback: not reachable
    ]
    answers = []
    for forward in forwards:
        tunnel = subprocess.Popen(
            ["ssh", *options, "-p", port, "-N", *forward, target],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            answers.append(_fetch_through(local_port, socks=forward[0] == "-D"))
        finally:
            tunnel.kill()
            tunnel.wait(timeout=10)
    assert "served-from-container" in answers[0] and "served-from-container" in answers[1]
    assert "served-from-container" not in answers[2] and not answers[2].startswith("HTTP")


def _fetch_through(port: int, *, socks: bool) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        curl = ["curl", "-s", "-m", "3", *(["--socks5-hostname", f"127.0.0.1:{port}"] if socks else [])]
        url = "http://127.0.0.1:8888/index.html" if socks else f"http://127.0.0.1:{port}/index.html"
        answer = subprocess.run([*curl, url], capture_output=True, text=True, check=False)
        if answer.returncode in (0, 52, 56):  # answered, or the tunnel closed the connection (nothing there)
            return answer.stdout
        time.sleep(0.2)
    return ""


def test_after_teardown_nothing_of_the_customer_is_left_and_the_other_container_runs_on(
    two_customers,  # noqa: F811
    admin,
    admin_user,
    django_capture_on_commit_callbacks,
):
    (order, access, private_key), (_other, other, _key) = two_customers
    _in(access, private_key, "(setsid sleep 600 </dev/null >/dev/null 2>&1 &)")
    assert tenant_processes(admin, access.username)
    with django_capture_on_commit_callbacks(execute=True):
        runs.teardown_start(order=order, actor=admin_user, reason="test")
    teardown = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
    assert teardown.status == ProvisioningRun.Status.SUCCEEDED, teardown.error
    assert customer_ssh(access, private_key, "true").returncode != 0
    name = f"binome-{access.username}"
    assert not admin.run(["podman", "container", "exists", name], check=False).ok
    assert not admin.run(["podman", "network", "exists", name], check=False).ok
    assert not tenant_processes(admin, access.username)
    assert admin.run(["podman", "volume", "exists", f"{name}-data"], check=False).ok  # kept until the wipe
    running = ["podman", "container", "inspect", "--format", "{{.State.Running}}", f"binome-{other.username}"]
    assert admin.run(running).stdout.strip() == "true"
    order.refresh_from_db()
    assert order.status == OrderStatus.ENDED


@pytest.fixture
def image_without(test_image):
    """The test image less some files (no registry here: images are made locally)."""
    made = []

    def make(*paths: str) -> str:
        tag = f"localhost/binome-test-less:{secrets.token_hex(4)}"
        name = f"binome-make-{secrets.token_hex(4)}"
        podman = ["podman", "--runtime", "runc"]
        ulimits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
        subprocess.run([*podman, "run", "--name", name, *ulimits, test_image, "rm", "-f", *paths], check=True)
        subprocess.run(["podman", "commit", "--quiet", name, tag], check=True, capture_output=True)
        subprocess.run(["podman", "rm", name], check=True, capture_output=True)
        made.append(tag)
        return tag

    yield make
    for tag in made:
        subprocess.run(["podman", "rmi", "--force", tag], check=False, capture_output=True)


def test_an_image_without_sshd_is_refused_with_the_reason_and_sftp_never_runs_on_the_host(
    client, container_host, booking_data, keypair, admin_user, admin, image_without, catalog, tmp_path,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    from booking.models import EnvironmentImage

    environment = EnvironmentImage.objects.first()
    EnvironmentImage.objects.filter(pk=environment.pk).update(image_ref=image_without("/usr/sbin/sshd"))
    order, username, _key = _provision(
        client, booking_data, keypair, admin_user, django_capture_on_commit_callbacks, "nosshd"
    )
    try:
        run = order.provisioning_runs.get(kind="provision")
        assert run.status == ProvisioningRun.Status.FAILED
        assert "cannot be handed to a customer: it has no sshd(/usr/sbin/sshd)" in run.error
        assert order.status == OrderStatus.PROVISIONING_FAILED
    finally:
        remove_user(admin, username)

    # an image with sshd but no sftp-server (many CUDA images): sftp is sshd's own, inside the container
    Lot.objects.create(
        name="containers · GPUs 2,3", hardware_class=catalog["b200-pair"], host=container_host, gpu_indices="2,3"
    )
    EnvironmentImage.objects.filter(pk=environment.pk).update(
        image_ref=image_without("/usr/lib/openssh/sftp-server", "/usr/lib/sftp-server")
    )
    order, username, private_key = _provision(
        client, booking_data, keypair, admin_user, django_capture_on_commit_callbacks, "nosftp"
    )
    try:
        access = _hand_over(order, admin_user, django_capture_on_commit_callbacks)
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(access.known_hosts_line + "\n")
        argv = ["sftp", *customer_ssh_options(private_key, known_hosts), "-P", str(access.ssh_port), "-b", "-"]
        listed = subprocess.run(
            [*argv, f"{username}@127.0.0.1"], input="ls /opt\npwd\n", capture_output=True, text=True, check=False
        )
        assert listed.returncode == 0, listed.stderr
        assert "binome" in listed.stdout and f"/home/{username}" in listed.stdout
        assert not admin.run(["pgrep", "-u", username, "-f", "sftp-server"], check=False).ok
    finally:
        remove_user(admin, username)


def test_the_order_page_gives_the_container_s_port_host_key_shares_and_disk_in_both_languages(client, two_customers):  # noqa: F811
    order, access, _key = two_customers[0]
    url = reverse("customer:order", kwargs={"public_id": order.public_id, "token": order.token})
    english = client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert f"ssh -p {access.ssh_port} {access.username}@127.0.0.1" in english
    assert f"[127.0.0.1]:{access.ssh_port} ssh-ed25519 " in english
    assert f"You land in a container of {order.environment.name}" in english
    assert "Data volume: 1 GiB." in english and "1.5 CPUs, 2g of memory" in english
    french = client.get(url, HTTP_ACCEPT_LANGUAGE="fr").content.decode()
    assert f"Vous arrivez dans un conteneur {order.environment.name}" in french
    assert "Volume de données : 1 Gio." in french


def test_the_split_trial_commands_of_the_guide_and_the_order_page_run_as_written_in_the_customer_s_container(
    client,
    two_customers,  # noqa: F811
):
    order, access, private_key = two_customers[0]
    for language in ("en", "fr"):
        # given: the guide in the researcher's language, and the command it tells them to type on the machine
        client.cookies["django_language"] = language
        guide = client.get(reverse("customer:guide")).content.decode()
        commands = [html.unescape(code) for code in re.findall(r"<code>([^<]*split_trial\.py[^<]*)</code>", guide)]
        assert commands == ["python3 /opt/binome/split_trial.py --help"], (language, commands)

        # when: they type it, as written, in their container (their home as the working directory)
        typed = _in(access, private_key, commands[0])

        # then: the kit answers with its usage
        assert typed.stdout.startswith("usage: split_trial.py"), (language, typed.stdout[:500])

        # and: the order page's report line names the kit where the container has it, read-only
        page = client.get(reverse("customer:order", kwargs={"public_id": order.public_id, "token": order.token}))
        (kit,) = set(re.findall(r"python3 (\S+/split_trial\.py) --output report\.json", page.content.decode()))
        checked = _in(access, private_key, f"test -r {kit} && test ! -w {kit} && echo readable")
        assert checked.stdout.strip() == "readable", (language, kit)


def _order_page_lines(client, order) -> tuple[str, str, str]:
    """The login line, the host key line and the Jupyter forward line, as the order page shows them."""
    page = client.get(reverse("customer:order", kwargs={"public_id": order.public_id, "token": order.token}))
    text = page.content.decode()
    command = html.unescape(re.search(r"<p><code>(ssh [^<]+)</code>", text)[1])
    known_hosts_line = html.unescape(re.search(r'<code class="wrap">([^<]+)</code>', text)[1])
    forward = html.unescape(re.search(r'<code class="forward">([^<]+)</code>', text)[1])
    return command, known_hosts_line, forward


def test_the_order_page_s_login_line_works_as_written_from_a_researcher_s_own_account(
    client,
    two_customers,  # noqa: F811
):
    order, access, private_key = two_customers[0]
    command, known_hosts_line, _forward = _order_page_lines(client, order)
    # given: the researcher's own account, their key and the page's host key line where ssh looks for them
    with researcher_account(private_key, known_hosts_line) as typed:
        # when: they type the page's command, as written, with a command to run
        answer = typed(f"{command} id -un")

    # then: they are in their container, as their account, the host key checked against the page's line
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == access.username
    assert "Warning: Permanently added" not in answer.stderr  # the key was known, not learnt


def test_a_server_on_8888_in_the_container_is_reached_through_the_order_page_s_forward_line(
    client,
    two_customers,  # noqa: F811
):
    order, access, private_key = two_customers[0]
    command, known_hosts_line, forward = _order_page_lines(client, order)
    assert forward == f"ssh -N -L 8888:localhost:8888 -p {access.ssh_port} {access.username}@{access.host.address}"
    with researcher_account(private_key, known_hosts_line) as typed:
        # given: a web server on 8888 in the container (Jupyter's port), serving the home directory
        started = typed(
            f"{command} 'echo served-from-the-container > served.txt && "
            "setsid -f python3 -m http.server 8888 --bind 127.0.0.1 </dev/null >/dev/null 2>&1'"
        )
        assert started.returncode == 0, started.stderr
        # when: the researcher runs the page's forward line on their machine
        tunnel = typed(forward, background=True)
        try:
            body, deadline = None, time.monotonic() + 30
            while body is None and time.monotonic() < deadline and tunnel.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", 8888), timeout=2) as connection:
                        connection.sendall(b"GET /served.txt HTTP/1.0\r\nHost: localhost\r\n\r\n")
                        body = b"".join(iter(lambda: connection.recv(65536), b""))
                except OSError:
                    time.sleep(0.3)
            # then: http://localhost:8888 on their machine is the container's server
            assert body is not None, tunnel.stderr.read().decode() if tunnel.poll() is not None else "no answer"
            assert body.startswith(b"HTTP/1.0 200") and body.endswith(b"served-from-the-container\n")
        finally:
            os.killpg(tunnel.pid, signal.SIGTERM)
            tunnel.wait(timeout=10)


@pytest.mark.parametrize(
    ("removed", "missing"),
    [
        (("/usr/bin/tar",), "tar"),
        (("/usr/bin/wget",), "curl-or-wget"),  # the test image has no curl
        ((f"/usr/lib/{platform.machine()}-linux-gnu/libstdc++.so.6",), "libstdc++(GLIBCXX_3.4.25)"),
        (("/bin/bash", "/usr/bin/bash"), "bash"),
    ],
)
def test_an_image_without_what_vs_code_s_server_needs_is_refused_with_the_reason(
    admin, test_image, image_without, removed, missing
):
    from provisioning.containers import Runtime
    from provisioning.host_probe import image_facts

    command = Runtime("podman").command
    assert image_facts(admin, command, test_image).problem == ""  # the whole image serves SSH, the kit and VS Code
    problem = image_facts(admin, command, image_without(*removed)).problem
    assert problem.startswith(f"it has no {missing} (VS Code Remote-SSH's server needs bash, tar, curl or wget")


# What VS Code Remote-SSH sends over its connection to set its server up (its install script, in short): the
# platform, the requirements its check-requirements script reads, a directory of its own in the home, the server
# fetched with wget or curl and unpacked with tar, started on a port of the container's loopback; then the client
# reaches that port through a forward of the same connection.
VSCODE_BOOTSTRAP = r"""
set -e
case "$(uname -m)" in x86_64|aarch64|armv7l) ;; *) echo "unsupported platform"; exit 1 ;; esac
glibc=$(getconf GNU_LIBC_VERSION | cut -d' ' -f2)
[ "$(printf '%s\n2.28\n' "$glibc" | sort -V | head -n1)" = 2.28 ] || { echo "glibc $glibc"; exit 1; }
found=
for lib in /usr/lib/*/libstdc++.so.6 /usr/lib64/libstdc++.so.6; do
    [ -r "$lib" ] && grep -q GLIBCXX_3.4.25 "$lib" && found=1
done
[ -n "$found" ] || { echo "no libstdc++ 3.4.25"; exit 1; }
server_dir="$HOME/.vscode-server/bin/0123456789abcdef"
mkdir -p "$server_dir" && cd "$server_dir"
if command -v wget >/dev/null; then
    wget --tries=1 --connect-timeout=7 -nv -O vscode-server.tar.gz "$SERVER_URL"
else
    curl --retry 1 --connect-timeout 7 --location --show-error --silent --output vscode-server.tar.gz "$SERVER_URL"
fi
tar -xf vscode-server.tar.gz --strip-components 1 && rm vscode-server.tar.gz
log="$HOME/.vscode-server/.0123456789abcdef.log"
setsid -f "$server_dir/bin/code-server" --host=127.0.0.1 --port=0 >"$log" 2>&1 </dev/null
for _ in $(seq 100); do
    grep -q '^listeningOn==' "$log" && break
    sleep 0.1
done
grep '^listeningOn==' "$log"
"""

# The stand-in for VS Code's server (not reachable here): started as VS Code starts its own, it says its port so.
CODE_SERVER = """#!/bin/bash
exec python3 -c '
import http.server
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"vscode-server-stand-in")
server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
print(f"listeningOn=={server.server_port}==", flush=True)
server.serve_forever()
'
"""


def test_vs_code_remote_ssh_sets_its_server_up_in_the_container_as_it_does_on_connect(
    client,
    two_customers,  # noqa: F811
    outside_server,  # noqa: F811
    tmp_path,
):
    order, _access, private_key = two_customers[0]
    command, known_hosts_line, _forward = _order_page_lines(client, order)
    # given: VS Code's server as its download site serves it, "on the internet"
    package = tmp_path / "site" / "vscode-server.tar.gz"
    (tmp_path / "server" / "vscode-server-linux-x64" / "bin").mkdir(parents=True)
    code_server = tmp_path / "server" / "vscode-server-linux-x64" / "bin" / "code-server"
    code_server.write_text(CODE_SERVER)
    code_server.chmod(0o755)
    package.parent.mkdir()
    subprocess.run(["tar", "-czf", package, "-C", tmp_path / "server", "vscode-server-linux-x64"], check=True)
    namespace = outside_server[1]
    site = subprocess.Popen(
        ["ip", "netns", "exec", namespace, "python3", "-m", "http.server", "8081", "--bind", "198.51.100.2",
         "--directory", package.parent],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:  # the site answers (the host routes to the namespace)
            try:
                socket.create_connection(("198.51.100.2", 8081), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and site.poll() is None, "the download site did not start"
                time.sleep(0.2)
        with researcher_account(private_key, known_hosts_line) as typed:
            # when: VS Code connects with the researcher's ssh settings (the page's login line) and runs its setup
            script = "SERVER_URL=http://198.51.100.2:8081/vscode-server.tar.gz\n" + VSCODE_BOOTSTRAP
            setup = typed(f"{command} bash", input=script)
            assert setup.returncode == 0, setup.stdout + setup.stderr
            port = int(re.fullmatch(r"listeningOn==(\d+)==", setup.stdout.strip().splitlines()[-1])[1])

            # then: its client reaches the server through a forward of the same login
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                local = probe.getsockname()[1]
            tunnel = typed(command.replace("ssh", f"ssh -N -L {local}:127.0.0.1:{port}", 1), background=True)
            try:
                body, deadline = None, time.monotonic() + 30
                while body is None and time.monotonic() < deadline and tunnel.poll() is None:
                    try:
                        with socket.create_connection(("127.0.0.1", local), timeout=2) as connection:
                            connection.sendall(b"GET / HTTP/1.0\r\n\r\n")
                            body = b"".join(iter(lambda: connection.recv(65536), b""))
                    except OSError:
                        time.sleep(0.3)
                assert body is not None and body.endswith(b"vscode-server-stand-in"), body
            finally:
                os.killpg(tunnel.pid, signal.SIGTERM)
                tunnel.wait(timeout=10)
            listed = typed(f"{command} ls -a .vscode-server/bin/0123456789abcdef/bin")
            assert "code-server" in listed.stdout.split()  # in the researcher's home, their data volume
    finally:
        site.kill()
        site.wait()


def test_what_the_guide_says_can_be_installed_where_holds_in_the_container(
    client,
    two_customers,  # noqa: F811
):
    (_order, access, private_key), (_other, other_access, other_key) = two_customers
    guide = html.unescape(client.get(reverse("customer:guide")).content.decode())
    section = guide[guide.index('<section id="environment">') :]
    venv = re.search(r"<code>(python3 -m venv ~/env)</code>", section)[1]
    assert "neither <code>apt-get update</code> nor <code>apt-get install</code> can write there" in " ".join(
        section.split()
    )

    # the system is read-only, for root in the container too: apt can neither update nor install
    for user in ("", "root"):
        for apt in ("apt-get update", "apt-get install -y hello"):
            refused = customer_ssh(access, private_key, apt, user=user, timeout=60)
            assert refused.returncode != 0, (user, apt, refused.stdout)
    written = customer_ssh(access, private_key, "touch /usr/local/probe", user="root")
    assert written.returncode != 0 and "Read-only file system" in written.stderr, written.stderr
    # a virtual environment, made as the guide writes it, lives in the home (the data volume) and runs
    made = _in(access, private_key, f"{venv} && ~/env/bin/python -c 'import sys; print(sys.prefix)'", timeout=120)
    assert made.stdout.strip() == f"/home/{access.username}/env"
    assert _in(access, private_key, "df --output=target ~/env | tail -n 1").stdout.strip() == f"/home/{access.username}"
    # and nothing of it reaches the other tenant
    assert customer_ssh(other_access, other_key, "test -e ~/env || ls /home").stdout.split() == [other_access.username]


def test_the_checks_the_readings_alerts_give_run_as_written_in_the_container(
    two_customers,  # noqa: F811
):
    """The readings' alert e-mails (an unbalanced split, idle cards) give one-line checks to type on the machine: each
    is typed as written, as the researcher, and shows their own processes and volume, nothing of the other tenant."""
    from django.core import mail

    from provisioning import watch
    from provisioning.models import WatchAlert

    (order, access, private_key), (_other, other_access, other_key) = two_customers
    order.checkpoint_dir, order.checkpoint_watch_hours = "runs/ckpt", 6
    order.save(update_fields=["checkpoint_dir", "checkpoint_watch_hours"])
    for kind in WatchAlert.Kind.values:
        alert = WatchAlert.objects.create(
            order=order, kind=kind, started_at=order.starts_at, last_seen_at=order.starts_at
        )
        watch.watch_alert_send(order=order, alert=alert)
    typed = {
        line.strip()
        for message in mail.outbox[-len(WatchAlert.Kind.values) :]
        for line in message.body.splitlines()
        if line.startswith("   ") and line.strip().split()[0] in {"ps", "top", "df"}
    }
    assert len(typed) == 3, typed  # ps (in both), top, df

    busy = "sleep 4321"
    _in(access, private_key, f"nohup {busy} >/dev/null 2>&1 &")
    _in(other_access, other_key, "nohup sleep 8765 >/dev/null 2>&1 &")
    for command in sorted(typed):
        shown = _in(access, private_key, command).stdout
        if command.startswith("ps"):  # their sleep, with its arguments; not the other tenant's
            assert busy in shown and "8765" not in shown and other_access.username not in shown, shown
        elif command.startswith("top"):  # one sleep: theirs (top names the command only)
            assert [line.split()[-1:] for line in shown.splitlines()].count(["sleep"]) == 1, shown
        else:
            assert shown.splitlines()[-1].split()[-1] == f"/home/{access.username}", shown
