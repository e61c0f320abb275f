"""How the suite is shared between two pytest-xdist workers (`PYTEST_WORKERS=2 make test`), a pytest plugin that
tests/conftest.py loads. Nothing here imports Django: tests/portal/test_test_layout.py runs it in a pytest of its own
on planted tests."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest

# The tests that use this machine as their GPU host (its sshd, podman, firewall, reserved ports, GPU device nodes) or
# run the production stack in podman share what a machine has one of: under pytest-xdist they run one after the other
# on a single worker, every other test beside them on the other (HostInTurn below). A test is the host's when it uses
# one of HOST_FIXTURES, directly or through another fixture, wherever its file is.
HOST_FIXTURES = frozenset(
    {
        "sshd",
        "container_sshd",
        "test_image",
        "environment_images",
        "fake_gpus",
        "outside_server",
        "stack",  # the compose stack (tests/portal/test_compose_stack.py)
        "host_stack",  # the compose stack with nginx and the worker's key (test_compose_stack_host.py)
    }
)


def tests_on_the_host(items) -> list[str]:
    """The ids of the tests that use the host: one unit of work for the scheduler, run in collection order."""
    return [item.nodeid for item in items if HOST_FIXTURES.intersection(getattr(item, "fixturenames", ()))]


# The scheduler runs in the controlling process, which sees test ids only, not fixtures: each worker writes the ids
# of the host's tests it collected into a directory the controller hands it, and the scheduler reads them back once
# every worker has collected (pytest-xdist schedules only then, and checks that the workers collected the same tests).
_HOST_TESTS_KEY = "binome_host_tests"
_host_tests_dir = pytest.StashKey()


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        config.stash[_host_tests_dir] = Path(tempfile.mkdtemp(prefix="binome-host-tests-"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[_HOST_TESTS_KEY] = str(node.config.stash[_host_tests_dir])


def pytest_collection_modifyitems(config, items):
    if folder := getattr(config, "workerinput", {}).get(_HOST_TESTS_KEY):
        Path(folder, config.workerinput["workerid"]).write_text(json.dumps(tests_on_the_host(items)))


def pytest_unconfigure(config):
    if folder := config.stash.get(_host_tests_dir, None):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: `-p no:xdist` runs without pytest-xdist
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's load scheduling (its default), except that the host's tests are one unit of work, given to one
    worker whole. (Its own `xdist_group` marks are lost on pytest 9, whose test ids no longer take the group's
    suffix pytest-xdist 3.8 writes into them.)"""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    folder = config.stash[_host_tests_dir]

    class HostInTurn(LoadScopeScheduling):
        host_tests: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.host_tests is None:  # read when the first scope is asked for: every worker has collected then
                written = sorted(folder.iterdir())
                if not written:
                    raise RuntimeError(f"no worker wrote the host's tests into {folder}")
                self.host_tests = frozenset(json.loads(written[0].read_text()))
            return "host" if nodeid in self.host_tests else nodeid

    return HostInTurn(config, log)
