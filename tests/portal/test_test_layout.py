"""The tests read like the code: no test module imports another (shared builders live in tests/builders/, fixtures
in conftest.py), tests/ mirrors the packages, and a test file is named after what it tests, not after an issue or
the red team that found it. Each rule is also shown refusing a planted tree."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Top-level folders of tests/ that name no package of the code: the browser journeys cross every package, and the
# builders are the shared helpers the tests import.
NOT_A_PACKAGE = {"browser", "builders"}

# A name that says where a test came from instead of what it tests: the red team, an issue number at the end.
NAMED_AFTER_ITS_ORIGIN = re.compile(r"red_?team|issue|_\d+$")


def imports_of_test_modules(tests: Path) -> list[str]:
    """`path:line module` for every import, anywhere in a file under `tests`, of a `test_*` module."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
                if tests.parent.joinpath(*node.module.split(".")).is_dir():  # `from tests.shop import test_cart`
                    modules += [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            found += [
                f"{path.relative_to(tests.parent)}:{node.lineno} {module}"
                for module in modules
                if module.rsplit(".", 1)[-1].startswith("test_")
            ]
    return found


def folders_naming_no_package(root: Path) -> list[str]:
    """Top-level folders of root/tests that name no top-level package of the code under root."""
    packages = {path.parent.name for path in root.glob("*/__init__.py") if path.parent.name != "tests"}
    return sorted(
        folder.name
        for folder in (root / "tests").iterdir()
        if folder.is_dir() and not folder.name.startswith(("_", ".")) and folder.name not in packages | NOT_A_PACKAGE
    )


def files_named_after_their_origin(tests: Path) -> list[str]:
    return sorted(
        str(path.relative_to(tests.parent))
        for path in tests.rglob("test_*.py")
        if NAMED_AFTER_ITS_ORIGIN.search(path.stem)
    )


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_no_test_module_imports_another_test_module():
    assert imports_of_test_modules(ROOT / "tests") == []


def test_an_import_of_a_test_module_is_refused_wherever_it_sits(tmp_path):
    # given a tree whose test modules borrow from each other, in every form an import can take
    root = _plant(
        tmp_path,
        {
            "tests/__init__.py": "",
            "tests/shop/__init__.py": "",
            "tests/shop/test_cart.py": "def full_cart(): ...\n",
            "tests/shop/test_checkout.py": "from tests.shop.test_cart import full_cart\n",
            "tests/shop/test_refund.py": "def test_it():\n    from tests.shop import test_cart\n",
            "tests/shop/test_stock.py": "import tests.shop.test_cart\n",
            "tests/builders/carts.py": "from shop.models import Cart\n",
            "tests/shop/conftest.py": "def test_image(): ...\n",
            "tests/shop/test_carts.py": "from tests.builders.carts import Cart\n",
            "tests/shop/test_images.py": "from tests.shop.conftest import test_image\n",
        },
    )
    # when the check reads it, then each borrowing is named and the imports of builders and conftest are not (even of a
    # fixture named like a test)
    assert imports_of_test_modules(root / "tests") == [
        "tests/shop/test_checkout.py:1 tests.shop.test_cart",
        "tests/shop/test_refund.py:2 tests.shop.test_cart",
        "tests/shop/test_stock.py:1 tests.shop.test_cart",
    ]


def test_every_top_level_test_folder_names_a_package_of_the_code():
    assert folders_naming_no_package(ROOT) == []


def test_a_test_folder_naming_no_package_is_refused(tmp_path):
    root = _plant(
        tmp_path,
        {
            "shop/__init__.py": "",
            "tests/__init__.py": "",
            "tests/shop/test_cart.py": "",
            "tests/browser/test_journeys.py": "",
            "tests/pages/test_home.py": "",
        },
    )
    assert folders_naming_no_package(root) == ["pages"]


def test_no_test_file_is_named_after_an_issue_or_the_red_team():
    assert files_named_after_their_origin(ROOT / "tests") == []


def test_a_test_file_named_after_an_issue_or_the_red_team_is_refused(tmp_path):
    root = _plant(
        tmp_path,
        {
            "tests/shop/test_red_team.py": "",
            "tests/shop/test_red_team_7.py": "",
            "tests/shop/test_issue_12.py": "",
            "tests/shop/test_cart_42.py": "",
            "tests/shop/test_cart_tokens.py": "",
            "tests/shop/test_sha256.py": "",
        },
    )
    assert files_named_after_their_origin(root / "tests") == [
        "tests/shop/test_cart_42.py",
        "tests/shop/test_issue_12.py",
        "tests/shop/test_red_team.py",
        "tests/shop/test_red_team_7.py",
    ]


class _Collected:
    """What the scheduler's plugin reads of a collected test: its id and the fixtures it uses, directly or not."""

    def __init__(self, nodeid: str, *fixturenames: str):
        self.nodeid, self.fixturenames = nodeid, fixturenames


def test_a_test_that_uses_the_host_through_any_fixture_is_the_host_s_wherever_its_file_is():
    from tests.scheduling import tests_of_the_stack, tests_on_the_host

    planted = [
        _Collected("tests/provisioning/test_shares.py::test_a", "db", "container_sshd"),
        _Collected("tests/booking/test_new.py::test_b", "client", "admin", "sshd"),
        _Collected("tests/booking/test_new.py::test_c[1]", "client", "catalog"),
        _Collected("tests/provisioning/test_shares.py::test_d", "db"),
        _Collected("tests/portal/test_compose_stack.py::test_e", "stack"),
    ]
    assert tests_on_the_host(planted) == [
        "tests/provisioning/test_shares.py::test_a",
        "tests/booking/test_new.py::test_b",
    ]
    # the production stack's tests are a unit of their own, run beside the host's: none may be of both
    assert tests_of_the_stack(planted) == ["tests/portal/test_compose_stack.py::test_e"]
    both = _Collected("tests/portal/test_compose_stack.py::test_f", "host_stack", "fake_gpus")
    with pytest.raises(pytest.UsageError, match="test_f"):
        tests_of_the_stack([*planted, both])


PLANTED_CONFTEST = """
import os, time
import pytest

pytest_plugins = ["tests.scheduling"]


def _log(name, event):
    with open(os.environ["PLANTED_LOG"], "a") as log:
        log.write(f"{os.environ['PYTEST_XDIST_WORKER']} {name} {event} {time.monotonic()}\\n")


def _held(request, seconds):
    _log(request.node.nodeid, "start")
    time.sleep(seconds)
    yield
    _log(request.node.nodeid, "end")


@pytest.fixture
def sshd(request):
    yield from _held(request, 0.2)


@pytest.fixture
def a_host_account(sshd):  # the host, through another fixture
    yield


@pytest.fixture
def stack(request):
    yield from _held(request, 0.1)


@pytest.fixture
def elsewhere(request):
    yield from _held(request, 0.05)
"""


def test_the_host_s_tests_run_one_after_the_other_on_one_worker_the_stack_s_on_another_and_the_rest_beside(tmp_path):
    """The suite's scheduler run as `make test` runs it (three workers), on planted tests in three files: those that
    use the host (directly or not) never overlap in time, whichever file holds them; the stack's neither, on a worker
    of their own from the start, beside the host's; the others run beside both."""
    import os
    import subprocess
    import sys

    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(PLANTED_CONFTEST)
    for name in ("a", "b", "c"):
        host = "".join(f"def test_{name}_host_{i}(sshd):\n    pass\n\n\n" for i in range(3))
        through = f"def test_{name}_through(a_host_account):\n    pass\n\n\n"
        others = "".join(f"def test_{name}_other_{i}(elsewhere):\n    pass\n\n\n" for i in range(8))
        stack = f"def test_{name}_stack(stack):\n    pass\n\n\n"
        (tmp_path / f"test_{name}.py").write_text(host + others + through + stack)
    log = tmp_path / "log"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider", "--numprocesses", "3", "-q"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PLANTED_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "39 passed" in run.stdout
    lines = [line.split() for line in log.read_text().splitlines()]
    host = [
        (worker, test, event, float(at)) for worker, test, event, at in lines if "_host_" in test or "through" in test
    ]
    assert len(host) == 24  # 12 tests, a start and an end each
    # one after the other: ordered by time, each start follows the previous test's end
    events = [event for *_, event, at in sorted(host, key=lambda entry: entry[3])]
    assert events == ["start", "end"] * 12
    # and the others beside them: on the other worker while the host's tests ran
    (host_worker,) = {worker for worker, *_ in host}
    first, last = min(at for *_, at in host), max(at for *_, at in host)
    beside = [test for worker, test, _, at in lines if "_other_" in test and first < float(at) < last]
    assert beside and all(worker != host_worker for worker, test, *_ in lines if test in beside)
    stack = sorted(
        [(worker, test, event, float(at)) for worker, test, event, at in lines if "_stack" in test],
        key=lambda entry: entry[3],
    )
    assert [event for *_, event, _at in stack] == ["start", "end"] * 3
    (stack_worker,) = {worker for worker, *_ in stack}
    assert stack_worker != host_worker
    assert stack[0][3] < last  # begun while the host's tests ran, not after them
