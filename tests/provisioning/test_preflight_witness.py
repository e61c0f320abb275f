"""The pre-flight's witness reads the container's processes with its own script: before the hand-over, a container
running only the runtime's init, the supervisor shell and its sleep is witnessed as running nothing of the
customer's. (Two branches once merged two module constants of one name, and the later, end_sessions' script,
replaced the witness's: every pre-flight was then labelled the customer's word.)"""

import subprocess

from provisioning import container_steps
from provisioning.step_context import StepContext


class _Recorder:
    """A connection that answers the witness's one round trip as a host with a clean container would: its init
    (catatonit), the supervisor shell and its sleep, an empty keys file. It answers only the witness's script."""

    is_dry_run = False

    def __init__(self):
        self.scripts = []

    def run(self, argv, check=True, timeout=None):
        script = argv[2]
        self.scripts.append(script)
        witness = 'container inspect --format "{{.State.Pid}}" "$3"' in script
        stdout = "4242\n4242 1 catatonit\n4243 4242 sh\n4244 4243 sleep\n" if witness else ""
        return subprocess.CompletedProcess(argv, 0, stdout=stdout, stderr="")


def test_the_pre_flight_s_witness_reads_the_container_s_processes():
    """The witness sends its own script (the container's init pid by the runtime, then the processes below it) and
    takes init, the supervisor and its sleep for nothing of the customer's."""
    connection = _Recorder()
    context = StepContext(
        username="bn-abc", comment="", authorized_keys="", gpu_indices=[0], expect_arch="", expect_vendor="nvidia",
        image_ref="", container_runtime="podman", keys_expire_at=None,
    )  # fmt: skip
    assert container_steps._nothing_of_the_customer_runs(connection, context) is True, connection.scripts[0][:120]
