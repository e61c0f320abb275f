"""A card belongs to one window at a time, by construction (issue 33), tried as the operator whose move fails and as
the next customer who wants the cards, on the real harness (the test sshd as the host, podman with runc, mknod
stand-ins for /dev/nvidia0..3): a move that fails keeps the lot it left off sale and is retried until it succeeds;
no container starts on cards another container holds, whatever the bookings say; the host check lists every
container with its cards and flags a card held twice."""

import subprocess

import pytest

from inventory.models import Host, Lot
from provisioning import hosts
from provisioning.models import ProvisioningRun
from tests.builders.containers import _hand_over, _nvidia_nodes, _provision, _remove_container, _stray_container
from tests.provisioning.conftest import loopback_port_base, remove_user

pytestmark = pytest.mark.django_db


def _container_exists(name: str) -> bool:
    return subprocess.run(["podman", "container", "exists", name], check=False).returncode == 0


def test_no_container_starts_on_cards_another_container_holds_whatever_the_bookings_say(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, fake_gpus,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    """The host is registered twice (an operator's mistake the bookings cannot see): its GPUs 0,1 are Alice's lot on
    one record and a free lot on the other. Mallory books that free lot; her container must not start on Alice's
    cards."""
    callbacks = django_capture_on_commit_callbacks
    made = []
    try:
        alice, alice_user, alice_key = _provision(client, booking_data, keypair, admin_user, callbacks, "alice")
        made.append(alice_user)
        access = _hand_over(alice, admin_user, callbacks)
        twin = Host.objects.create(
            name="containers-twin", address="127.0.0.1", ssh_port=container_host.ssh_port, driver=Host.Driver.SSH,
            admin_user="root", host_key=container_host.host_key, container_runtime="podman", disk_per_lot_gib=1,
            ssh_port_base=loopback_port_base(),
        )  # fmt: skip
        Lot.objects.create(name="twin · GPUs 0,1", hardware_class=catalog["b200-pair"], host=twin, gpu_indices="0,1")

        # when Mallory books the lot the bookings call free, is approved and provisioned
        mallory, mallory_user, _key = _provision(client, booking_data, keypair, admin_user, callbacks, "mallory")
        made.append(mallory_user)

        # then her provisioning stops at the container, naming who holds the cards, and no container of hers exists
        assert mallory.allocations.get().lot.host == twin
        run = mallory.provisioning_runs.get(kind=ProvisioningRun.Kind.PROVISION)
        assert run.status == ProvisioningRun.Status.FAILED
        assert f"GPU 0, 1 held by binome-{alice_user} (running)" in run.error, run.error
        assert not _container_exists(f"binome-{mallory_user}")
        # and Alice still works on her cards
        assert _nvidia_nodes(access, alice_key) == ["nvidia0", "nvidia1"]
    finally:
        for username in made:
            remove_user(admin, username)


def test_the_host_check_flags_a_card_held_by_two_containers(container_host, test_image, fake_gpus):
    strays = []
    try:
        strays = [_stray_container(test_image, fake_gpus, 3), _stray_container(test_image, fake_gpus, 2, 3)]
        strays.append(_stray_container(test_image, fake_gpus))  # no card at all
        subprocess.run(["podman", "stop", "--time", "0", strays[1]], check=True, capture_output=True)

        report = hosts.host_check(host=container_host, device_dir=str(fake_gpus)).finding.report
        assert f"container {strays[2]} (running): no GPU" in report

        assert f"container {strays[0]} (running): GPU 3" in report
        assert f"container {strays[1]} (exited): GPU 2, 3" in report  # stopped, it starts again with its cards
        assert f"WARNING: GPU 3 is held by 2 containers, two tenants on one card: {strays[0]} (running), " in report
        assert "WARNING: GPU 2" not in report
    finally:
        for name in strays:
            _remove_container(name)


class _AnotherStartAtOnce:
    """The host's real connection, through which another container is started on the same cards just before this
    run's own `podman run`: what a second worker does when both read the cards free a moment before."""

    def __init__(self, connection, start_other):
        self.connection, self.start_other = connection, start_other

    def run(self, argv, **options):
        if argv[:4] == ["podman", "--runtime", "runc", "run"] and "--detach" in argv and self.start_other:
            self.start_other(), setattr(self, "start_other", None)
        return self.connection.run(argv, **options)

    def __getattr__(self, name):
        return getattr(self.connection, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.connection.__exit__(*exc)


def test_of_two_containers_started_at_once_on_the_same_cards_the_later_one_is_removed(
    client, container_host, booking_data, keypair, admin_user, admin, test_image, fake_gpus, monkeypatch,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    from provisioning import execution

    strays, made = [], []
    connect = execution.host_connect
    monkeypatch.setattr(
        execution,
        "host_connect",
        lambda host: _AnotherStartAtOnce(
            connect(host=host), lambda: strays.append(_stray_container(test_image, fake_gpus, 1))
        ),
    )
    try:
        order, username, _key = _provision(
            client, booking_data, keypair, admin_user, django_capture_on_commit_callbacks, "alice"
        )
        made.append(username)

        run = order.provisioning_runs.get(kind=ProvisioningRun.Kind.PROVISION)
        assert run.status == ProvisioningRun.Status.FAILED
        assert f"another container took the lot's cards while this one started: GPU 1 held by {strays[0]}" in run.error
        assert not _container_exists(f"binome-{username}") and _container_exists(strays[0])
    finally:
        for name in strays:
            _remove_container(name)
        for username in made:
            remove_user(admin, username)


# --- what the runtime says, read as hostile input ---------------------------------------------------------------


ALLOW_GPU_1 = {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rwm"}


def _oci(*rules: dict, devices: tuple[dict, ...] = ()) -> str:
    import json

    return json.dumps({"linux": {"devices": list(devices), "resources": {"devices": [
        {"allow": False, "access": "rwm"}, *rules]}}})  # fmt: skip


@pytest.mark.parametrize(
    ("config", "cards", "every"),
    [
        (_oci({"allow": True, "type": "c", "major": 195, "minor": 2, "access": "rwm"}), {2}, False),
        # the control nodes open no card; AMD's render nodes are another vendor's
        (_oci({"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rw"}), set(), False),
        (_oci({"allow": True, "type": "c", "major": 226, "minor": 129, "access": "rw"}), set(), False),
        # a node made inside counts even when a later rule denies it (a holder is never missed)
        (_oci(devices=({"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3},)), {3}, False),
        # wildcards: every card of the kind, every device (privileged)
        (_oci({"allow": True, "type": "c", "major": 195, "access": "rwm"}), set(), True),
        (_oci({"allow": True, "access": "rwm"}), set(), True),
        # the last rule that matches decides; mknod alone opens nothing
        (_oci(ALLOW_GPU_1, {**ALLOW_GPU_1, "allow": False}), set(), False),
        (_oci({"allow": True, "type": "c", "major": 195, "minor": 1, "access": "m"}), set(), False),
        # junk
        ("not json", set(), True),  # podman's own file, unreadable: it may open any card
        ('{"linux": {"resources": {"devices": [42, "x", {"allow": true, "minor": "1"}]}}}', set(), True),
        ("[" * 100_000, set(), True),  # nested too deep for the parser: not parsed, not a crash
    ],
)
def test_an_oci_configuration_says_which_nvidia_cards_a_container_holds(config, cards, every):
    from provisioning.cards import _from_oci_config

    found: set[int] = set()
    assert _from_oci_config(config, "nvidia", found) is every
    assert found == cards


@pytest.mark.parametrize(
    ("host_config", "cards", "every"),
    [
        ({"Devices": [{"PathOnHost": "/dev/dri/renderD130"}, {"PathOnHost": "/dev/kfd"}]}, {2}, False),
        ({"DeviceCgroupRules": ["c 226:129 rwm", "c 195:* rwm"]}, {1}, False),
        ({"DeviceCgroupRules": ["c 226:* rw"]}, set(), True),
        ({"Privileged": True}, set(), True),
        ({"DeviceRequests": [{"Driver": "amd", "Count": -1}]}, set(), False),
        ({"Devices": "nonsense", "DeviceCgroupRules": [None, "c 1:2"], "DeviceRequests": ["x"]}, set(), False),
    ],
)
def test_docker_s_inspect_data_says_which_amd_cards_a_container_holds(host_config, cards, every):
    from provisioning.cards import _from_docker_host_config

    found: set[int] = set()
    assert _from_docker_host_config(host_config, "amd", found) is every
    assert found == cards


def test_a_gpu_request_by_uuid_counts_as_every_card_and_times_order_the_starts():
    from provisioning.cards import CardHolder, _created_ns, _from_docker_host_config, held_twice

    found: set[int] = set()
    requests = {"DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": ["0", "GPU-5f1c…"], "Count": 0}]}
    assert _from_docker_host_config(requests, "nvidia", found) is True and found == {0}
    assert _created_ns("2026-12-06T04:40:06.123456789Z") == _created_ns("2026-12-06T04:40:06Z") + 123456789
    assert _created_ns("1796532139676648842") == 1796532139676648842 and _created_ns("yesterday") == 0
    one, every = CardHolder("a", "running", 1, frozenset({1})), CardHolder("b", "exited", 2, every_card=True)
    assert held_twice([one, every]) == {"1": [one, every], "every GPU": [one, every]}
