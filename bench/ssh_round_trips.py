"""The portal's SSH round trip per command, on a real sshd on 127.0.0.1 (as root: it starts one, as the tests do).

    .venv/bin/python bench/ssh_round_trips.py [--commands 200]

Runs `true` through the SSH driver (provisioning/drivers/ssh.py) on one connection, alternating in rounds between the
driver as it is (TCP_NODELAY on its socket) and the same connection with Nagle's algorithm put back, and prints the
median per command of each, side by side (these machines are noisy: ratios from one run). A provisioning sends about
60 commands per order, each waiting for the one before: with Nagle's algorithm every command's small writes wait for
the peer's delayed ACK. Target: the driver's median is below a quarter of Nagle's.
"""

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commands", type=int, default=200)
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    os.environ.setdefault("DEBUG", "1")
    import django

    django.setup()
    from provisioning.drivers.ssh import SSHDriver
    from tests.provisioning.conftest import running_sshd

    with running_sshd() as server, SSHDriver().connect(server.host_spec) as connection:
        sock = connection._client.get_transport().sock  # the bench's one look inside: the option under test
        timings: dict[int, list[float]] = {1: [], 0: []}
        for _round in range(max(1, options.commands // 20)):
            for nodelay in (1, 0):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, nodelay)
                for _ in range(10):
                    started = time.perf_counter()
                    connection.run(["true"])
                    timings[nodelay].append(time.perf_counter() - started)
    driver, nagle = (statistics.median(timings[key]) * 1000 for key in (1, 0))
    print(f"commands: {len(timings[1])} each; median per command: driver {driver:.1f} ms, Nagle {nagle:.1f} ms")
    print(f"ratio driver/Nagle: {driver / nagle:.2f}")
    print("PASS" if driver < nagle / 4 else "FAIL")


if __name__ == "__main__":
    main()
