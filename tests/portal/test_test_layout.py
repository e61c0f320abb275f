"""The tests read like the code: no test module imports another (shared builders live in tests/builders/, fixtures
in conftest.py), tests/ mirrors the packages, and a test file is named after what it tests, not after an issue or
the red team that found it. Each rule is also shown refusing a planted tree."""

import ast
import re
from pathlib import Path

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
    """What the check reads of a collected test: its id and the fixtures it uses, directly or not."""

    def __init__(self, nodeid: str, *fixturenames: str):
        self.nodeid, self.fixturenames = nodeid, fixturenames


def test_every_file_that_runs_on_the_host_is_there_and_a_test_on_the_host_elsewhere_stops_the_collection():
    from tests.conftest import HOST_FILES, host_tests_outside_the_host_files

    # every file the scheduler gives to the host's worker exists (a renamed one would leave its tests unguarded)
    assert all((ROOT / path).is_file() for path in HOST_FILES)
    # a test using the host in a file of the host's: in order; one elsewhere, directly or through another fixture: named
    planted = [
        _Collected("tests/provisioning/test_shares.py::test_a", "db", "container_sshd"),
        _Collected("tests/booking/test_new.py::test_b", "client", "admin", "sshd"),
        _Collected("tests/booking/test_new.py::test_c[1]", "client", "catalog"),
    ]
    assert host_tests_outside_the_host_files(planted) == ["tests/booking/test_new.py::test_b"]
