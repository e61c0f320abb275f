"""How the suite is shared between pytest-xdist workers (`make test`, PYTEST_WORKERS of them), a pytest plugin that
tests/conftest.py loads. Nothing here imports Django: tests/portal/test_test_layout.py runs it in a pytest of its own
on planted tests."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest

# The tests that use this machine as their GPU host (its sshd, podman, firewall, reserved ports, GPU device nodes)
# share what a machine has one of: under pytest-xdist they run one after the other on a single worker, every other
# test beside them on the others (UnitsInTurn below). A test is the host's when it uses one of HOST_FIXTURES, directly
# or through another fixture, wherever its file is.
HOST_FIXTURES = frozenset(
    {
        "sshd",
        "container_sshd",
        "test_image",
        "environment_images",
        "fake_gpus",
        "outside_server",
    }
)
# The production stack's tests (tests/portal/test_compose_stack*.py) are a unit of their own, in turn on one worker
# (one compose project, one app image) and beside the host's: they build their images and run their services in
# podman, on networks of their own or the host's network, and touch nothing the host's tests set up or look at (a
# tenant's container, network, firewall rules, device nodes). Apart, the host's unit no longer waits for their
# build (about 4 minutes on a machine that never built the images).
STACK_FIXTURES = frozenset({"stack", "host_stack"})


def _uses(item, fixtures: frozenset[str]) -> bool:
    return bool(fixtures.intersection(getattr(item, "fixturenames", ())))


def tests_on_the_host(items) -> list[str]:
    """The ids of the tests that use the host: one unit of work for the scheduler, run in collection order."""
    return [item.nodeid for item in items if _uses(item, HOST_FIXTURES)]


def tests_of_the_stack(items) -> list[str]:
    """The ids of the production stack's tests: a second unit. No test may be of both: the two run side by side."""
    if both := [item.nodeid for item in items if _uses(item, HOST_FIXTURES) and _uses(item, STACK_FIXTURES)]:
        raise pytest.UsageError(f"tests using both the host and the compose stack, which run side by side: {both}")
    return [item.nodeid for item in items if _uses(item, STACK_FIXTURES)]


# The scheduler runs in the controlling process, which sees test ids only, not fixtures: each worker writes the ids
# of the host's and the stack's tests it collected into a directory the controller hands it, and the scheduler reads
# them back once every worker has collected (pytest-xdist schedules only then, and checks that the workers collected
# the same tests).
_UNITS_KEY = "binome_units"
_units_dir = pytest.StashKey()


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        config.stash[_units_dir] = Path(tempfile.mkdtemp(prefix="binome-units-"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[_UNITS_KEY] = str(node.config.stash[_units_dir])


def pytest_collection_modifyitems(config, items):
    if folder := getattr(config, "workerinput", {}).get(_UNITS_KEY):
        units = {"host": tests_on_the_host(items), "stack": tests_of_the_stack(items)}
        Path(folder, config.workerinput["workerid"]).write_text(json.dumps(units))


def pytest_unconfigure(config):
    if folder := config.stash.get(_units_dir, None):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: `-p no:xdist` runs without pytest-xdist
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's load scheduling (its default), except that the host's tests are one unit of work, given to one
    worker whole, and the stack's another: each starts at once (xdist gives out the units with the most tests first).
    (Its own `xdist_group` marks are lost on pytest 9, whose test ids no longer take the group's suffix pytest-xdist
    3.8 writes into them.)"""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    folder = config.stash[_units_dir]

    class UnitsInTurn(LoadScopeScheduling):
        units: dict[str, str] | None = None  # test id -> its unit, for the host's and the stack's tests

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:  # read when the first scope is asked for: every worker has collected then
                written = sorted(folder.iterdir())
                if not written:
                    raise RuntimeError(f"no worker wrote the host's and the stack's tests into {folder}")
                listed = json.loads(written[0].read_text())
                self.units = {test: unit for unit, tests in listed.items() for test in tests}
            return self.units.get(nodeid, nodeid)

    return UnitsInTurn(config, log)
