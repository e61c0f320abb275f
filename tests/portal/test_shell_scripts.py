"""Every shell script of the project passes shellcheck: the scripts on disk (CI, the launchers, the images' entry
points, the host's firewall guard) and the scripts the portal sends to a GPU host as `sh -c SCRIPT name args…`,
read from the Python source where they are written. A finding is fixed, or disabled in the script itself with a
`# shellcheck disable=SCxxxx # why` line, where the next reader sees the reason."""

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHELLS = {"sh", "/bin/sh", "bash", "/bin/bash"}
SOURCE_PACKAGES = (
    "booking",
    "infrastructure",
    "inventory",
    "nodekit",
    "payments",
    "portal",
    "provisioning",
    "web",
    "bench",
)
PLACEHOLDER = "X"  # an f-string's replacement field, as shellcheck reads it: one word


def shell_files() -> list[Path]:
    """Tracked files whose first line names a POSIX shell or bash."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for name in listed.splitlines():
        path = ROOT / name
        if path.suffix in {".py", ".md", ".html", ".txt", ".po"} or not path.is_file():
            continue
        with path.open("rb") as handle:
            first = handle.readline(200)
        if first.startswith(b"#!") and any(shell in first for shell in (b"/sh", b"bash")):
            found.append(path)
    return found


class _Scripts(ast.NodeVisitor):
    """The scripts of one module: each list or tuple literal `…, "sh", "-c", SCRIPT, …`, SCRIPT resolved through
    string literals, f-strings, concatenation, names bound in the function or the module, and one-return helpers."""

    def __init__(self, tree: ast.Module):
        self.module = self._bindings(tree.body, top=True)
        self.functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        self.found: dict[int, str | None] = {}
        self.scope = self.module

    @staticmethod
    def _bindings(body: list[ast.stmt], *, top: bool = False) -> dict[str, ast.expr]:
        nodes = body if top else list(ast.walk(ast.Module(body=body, type_ignores=[])))
        bound: dict[str, ast.expr] = {}
        for node in nodes:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                bound.setdefault(node.targets[0].id, node.value)
        return bound

    def text(self, node: ast.expr, depth: int = 0) -> str | None:
        if depth > 20:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            parts = [
                self.text(value, depth + 1) if isinstance(value, ast.Constant) else PLACEHOLDER for value in node.values
            ]
            return None if None in parts else "".join(parts)  # type: ignore[arg-type]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.text(node.left, depth + 1), self.text(node.right, depth + 1)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.Name) and node.id in self.scope:
            return self.text(self.scope[node.id], depth + 1)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions:
            helper = self.functions[node.func.id]
            returns = [each for each in ast.walk(helper) if isinstance(each, ast.Return) and each.value is not None]
            if len(returns) == 1:
                outer, self.scope = self.scope, {**self.module, **self._bindings(helper.body)}
                try:
                    return self.text(returns[0].value, depth + 1)  # type: ignore[arg-type]
                finally:
                    self.scope = outer
        return None

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.scope = self.scope, {**self.scope, **self._bindings(node.body)}
        self.generic_visit(node)
        self.scope = outer

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def _sequence(self, node: ast.List | ast.Tuple) -> None:
        items = node.elts
        for index in range(len(items) - 2):
            shell, flag = items[index], items[index + 1]
            if (
                isinstance(shell, ast.Constant)
                and shell.value in SHELLS
                and isinstance(flag, ast.Constant)
                and flag.value == "-c"
            ):
                self.found[node.lineno] = self.text(items[index + 2])
        self.generic_visit(node)

    visit_List = _sequence
    visit_Tuple = _sequence


def embedded_scripts() -> list[tuple[str, str | None]]:
    scripts = []
    for package in SOURCE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            source = path.read_text()
            if '"-c"' not in source:
                continue
            visitor = _Scripts(ast.parse(source))
            visitor.visit(ast.parse(source))
            scripts += [(f"{path.relative_to(ROOT)}:{line}", script) for line, script in sorted(visitor.found.items())]
    return scripts


def shellcheck(*args: str, script: str | None = None) -> subprocess.CompletedProcess:
    binary = shutil.which("shellcheck")
    assert binary, "shellcheck is not installed: apt-get install shellcheck (.ci/run does)"
    return subprocess.run([binary, "--format", "gcc", *args], input=script, capture_output=True, text=True, check=False)


def test_every_shell_script_in_the_repository_passes_shellcheck():
    files = shell_files()
    assert {"run", "reset-test-host", "binome-guard", "postgres-entrypoint"} <= {path.name for path in files}

    result = shellcheck("--external-sources", *map(str, files))

    assert result.returncode == 0, result.stdout


def test_every_script_the_portal_sends_to_a_host_passes_shellcheck():
    scripts = embedded_scripts()
    assert len(scripts) >= 25, scripts  # the provisioning steps' scripts were found
    unread = [where for where, script in scripts if script is None]
    findings = {}
    for where, script in scripts:
        if script is not None:
            result = shellcheck("--shell", "sh", "-", script=script)
            if result.returncode != 0:
                findings[where] = result.stdout
    # the guard is read from its file at run time (checked above as a file); every other script is read here
    assert [where.partition(":")[0] for where in unread] == ["provisioning/containers.py"], unread
    assert findings == {}


@pytest.mark.parametrize(
    ("script", "code"),
    [
        ("ids=$(ls); kill $ids", "SC2086"),  # an unquoted expansion
        ("for i in $(seq 3); do sleep 1; done", "SC2034"),  # a variable never read
    ],
)
def test_the_check_catches_what_it_is_there_for(script, code):
    result = shellcheck("--shell", "sh", "-", script=script)

    assert result.returncode != 0 and code in result.stdout
