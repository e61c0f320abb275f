"""This machine runs the order's container as provisioning will: Debian's podman with runc, the locally built
image (bin/test-image), started through the real SSH driver; fake GPU device nodes (mknod) show that a container
sees its lot's nodes and not the other lot's."""

import os
import secrets
import shutil
from pathlib import Path

import pytest

from provisioning.containers import ContainerSpec, run_argv

PROBE = (
    "ls /dev | grep '^nvidia' | tr '\\n' ' '; echo; id -u; ulimit -n; "
    "grep 'Max processes' /proc/self/limits | tr -s ' ' | cut -d' ' -f3; "
    "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status | tr -s '\\t' ' '; "
    "grep ^VERSION_CODENAME /etc/os-release; stat -f -c %T /tmp; stat -c %a $HOME; "
    "touch $HOME/written && echo home-writable; ls /home"
)


@pytest.fixture
def homes():
    """Two customers' homes on the host (700, owned by their uids)."""
    made = []
    for uid in (42001, 42002):
        home = Path(f"/home/binome-test-{uid}-{secrets.token_hex(3)}")
        home.mkdir(mode=0o700)
        os.chown(home, uid, uid)
        made.append((uid, home))
    try:
        yield made
    finally:
        for _uid, home in made:
            shutil.rmtree(home, ignore_errors=True)


def test_each_lot_s_container_sees_only_its_own_gpus_as_its_customer_without_privileges(
    admin, test_image, fake_gpus, homes
):
    seen = {}
    for (uid, home), lot in zip(homes, [(0, 1), (2, 3)], strict=True):
        spec = ContainerSpec(
            name=f"binome-test-{uid}-{secrets.token_hex(3)}",
            image=test_image,
            username=f"binome-test-{uid}",
            uid=uid,
            gid=uid,
            home=str(home),
            vendor="nvidia",
            gpu_indices=lot,
            use_cdi=False,
            device_dir=str(fake_gpus),
            shm_size="64m",
            tmp_size="64m",
        )
        result = admin.run(run_argv(spec, ["sh", "-c", PROBE]), timeout=120)
        seen[lot] = result.stdout.splitlines()

    for lot in ((0, 1), (2, 3)):
        devices, uid, nofile, nproc, cap_eff, no_new_privs, codename, tmp, home_mode, written, *listing = seen[lot]
        assert devices.split() == [f"nvidia{index}" for index in lot]  # and none of the other lot's
        assert uid in ("42001", "42002") and (nofile, nproc) == ("1024", "4096")
        assert cap_eff == "CapEff: 0000000000000000" and no_new_privs == "NoNewPrivs: 1"
        assert codename == "VERSION_CODENAME=bookworm" and tmp == "tmpfs"
        assert home_mode == "700" and written == "home-writable"
        assert len(listing) == 1  # the other customer's home is not even mounted
    assert not admin.run(["podman", "ps", "--all", "--quiet", "--filter", "name=binome-test-"]).stdout.strip()
