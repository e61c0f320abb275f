"""The idempotent steps of provisioning and teardown, run on one host through a driver connection.

Each step checks before it acts, so running it again after a crash finishes the job instead of doing it twice.
Commands are argv lists (quoted by the driver), never strings built from customer input.

The tenant boundary (docs/architecture.md): the customer controls everything inside their container and on their
data volume, and the host never reads or runs any of it. Their account on the host only gives the container a uid:
no login shell, a locked password, and a root-owned home (the kit directory) in which nothing is theirs, so no PAM
environment file, shell rc, user unit or key of theirs exists for the host's login stack to read. They log in to an
SSH server inside the container, on a port the host publishes from the container's own network namespace; its keys
are written at the hand-over, after the pre-flight check, so no process of theirs runs before it.
"""

from provisioning.container_steps import (
    end_sessions,
    preflight,
    prepare_data,
    prepare_image,
    remove_container,
    start_container,
    start_ssh,
)
from provisioning.download_steps import open_download
from provisioning.host_steps import (
    connect,
    create_user,
    install_keys,
    legacy_step,
    lock_user,
    prepare_host,
    revoke_keys,
    stop_processes,
    wipe_data,
)

PROVISION_STEPS = [
    "connect",
    "prepare_host",
    "create_user",
    "prepare_data",
    "prepare_image",
    "start_container",
    "preflight",
]
PREFLIGHT_STEPS = ["connect", "preflight"]
# A provider fault moves a running order: its new lots prepared (on the same host, the container is replaced and the
# data volume kept), checked and handed over at once: the window is already running.
MOVE_STEPS = [*PROVISION_STEPS, "install_keys", "start_ssh"]
# Locked first, so that no new session starts while the others are killed; each step checks its own work.
# A window that ended then opens its read-only download window until the wipe (nothing, when the order goes on).
# After the end, a key changed: open_download rewrites the window's keys file (sshd reads it at each login).
DOWNLOAD_KEYS_STEPS = ["connect", "open_download"]
TEARDOWN_STEPS = ["connect", "lock_user", "revoke_keys", "remove_container", "stop_processes", "open_download"]
WIPE_STEPS = ["connect", "wipe_data"]
# The hand-over (and a window that moved: the keys' expiry moves with it): the keys written, sshd answering.
KEYS_STEPS = ["connect", "install_keys", "start_ssh"]
# A key removed: the keys written first (it opens nothing new), then every open session ended (what it opened).
KEYS_REMOVED_STEPS = ["connect", "install_keys", "end_sessions", "start_ssh"]
DOWNLOAD_KEYS_REMOVED_STEPS = [*DOWNLOAD_KEYS_STEPS, "end_sessions"]
# A container that stopped during the window (its main process killed, a reboot): the firewall guard rebuilt, the
# container started again, its sshd answering (provisioning/restarts.py decides when, and when not any more).
RESTART_STEPS = ["connect", "start_ssh"]
STEPS = {
    function.__name__: function
    for function in (
        connect,
        prepare_host,
        create_user,
        prepare_data,
        prepare_image,
        start_container,
        preflight,
        install_keys,
        start_ssh,
        remove_container,
        revoke_keys,
        stop_processes,
        lock_user,
        wipe_data,
        open_download,
        end_sessions,
    )
}
# Steps of runs made before this design: done as nothing, so that such a run still finishes.
STEPS.update(dict.fromkeys(["restrict_gpus", "revoke_devices", "keep_or_wipe"], legacy_step))
