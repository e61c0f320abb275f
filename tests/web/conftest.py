"""The pages' tests use the fixtures of the apps whose state the pages show: the dev chain of tests/payments, the
probed host of tests/provisioning (sshd and the admin connection come with it, and the
ports that provisioning reserves are given back)."""

from tests.payments.conftest import chain  # noqa: F401 (fixtures)
from tests.provisioning.conftest import (  # noqa: F401 (fixtures)
    admin,
    probed_host,
    reserved_ports_restored,
    sshd,
)
