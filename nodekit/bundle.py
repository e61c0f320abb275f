"""The files shipped to the nodes: each script with nodekit/common.py inlined, one self-contained file.

A node runs a script as `python3 -I ~/.binome/preflight.py`, and a researcher downloads the split-trial kit as one
`split_trial.py`: neither has this package. So the script's one `from nodekit.common import …` line is replaced by
the body of common.py, and the result needs nothing but the standard library. A single .py file (rather than a
zipapp) keeps what people know: it can be read, downloaded under its own name, and run by path, and
multiprocessing's spawn children (the all-reduce ranks, the split-trial ranks) re-run it by that path.

The output depends only on the two source files, never on the working directory or the machine. The build refuses
what would make the inlined file mean something else than the package: an aliased or unknown name, a script that
defines a name common.py defines (the inlined copy would be shadowed), or an import of nodekit anywhere else.

    python -m nodekit.bundle split_trial > split_trial.py     # the file the portal ships, to run by hand
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SCRIPTS = ("preflight", "split_trial")
COMMON_MODULE = "nodekit.common"


class BundleError(Exception):
    """A script or common.py that cannot be inlined faithfully."""


HOST_FILES = ("sshd_config", "sshd_download_config", "binome-guard")


def host_file_bytes(name: str) -> bytes:
    """A file provisioning installs on hosts as it is (the containers' sshd configuration, the firewall guard)."""
    if name not in HOST_FILES:
        raise ValueError(f"no host file {name!r}: one of {', '.join(HOST_FILES)}")
    return (PACKAGE_DIR / name).read_bytes()


@functools.cache
def script_bytes(name: str) -> bytes:
    """The shipped file for `name` ("preflight" or "split_trial"), UTF-8."""
    if name not in SCRIPTS:
        raise ValueError(f"no node script {name!r}: one of {', '.join(SCRIPTS)}")
    script = (PACKAGE_DIR / f"{name}.py").read_text(encoding="utf-8")
    common = (PACKAGE_DIR / "common.py").read_text(encoding="utf-8")
    return inline(script, common, name=name).encode("utf-8")


def inline(script: str, common: str, *, name: str) -> str:
    """`script` with its `from nodekit.common import …` replaced by the body of `common` (see the module doc)."""
    tree = ast.parse(script)
    imports = [node for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == COMMON_MODULE]
    stray = [node for node in ast.walk(tree) if _imports_nodekit(node) and node not in imports]
    if stray:
        raise BundleError(f"{name}.py line {stray[0].lineno}: only one `from {COMMON_MODULE} import …` is inlined")
    if len(imports) > 1:
        raise BundleError(f"{name}.py imports from {COMMON_MODULE} more than once")
    lines = script.splitlines(keepends=True)
    header = f"# Built by nodekit/bundle.py from nodekit/{name}.py and the helpers it imports from nodekit/common.py\n"
    head = 1 if lines and lines[0].startswith("#!") else 0
    if not imports:
        return "".join([*lines[:head], header, *lines[head:]])
    (statement,) = imports
    body, defined = _common_body(common)
    for alias in statement.names:
        if alias.asname or alias.name not in defined:
            raise BundleError(f"{name}.py: import {alias.name} from {COMMON_MODULE} by its own name, no alias")
    clashes = sorted(_defined_names(tree.body) & defined)
    if clashes:
        raise BundleError(f"{name}.py defines {', '.join(clashes)} again: the inlined common.py would be shadowed")
    start, end = statement.lineno - 1, statement.end_lineno
    inlined = [
        "# ---- nodekit/common.py, inlined ----\n",
        *body,
        "# ---- end of nodekit/common.py ----\n",
    ]
    result = "".join([*lines[:head], header, *lines[head:start], *inlined, *lines[end:]])
    compile(result, f"{name}.py", "exec")  # a syntax error here is a bug of the build, not of the node
    return result


def _imports_nodekit(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "nodekit" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "nodekit"
    return False


def _common_body(common: str) -> tuple[list[str], set[str]]:
    """common.py's lines after its docstring and `from __future__` line, and the names it defines."""
    tree = ast.parse(common)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise BundleError(f"common.py line {node.lineno}: no relative import, the standard library only")
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            outside = [module for module in modules if module.split(".")[0] not in sys.stdlib_module_names]
            if outside:
                raise BundleError(f"common.py line {node.lineno}: the standard library only, not {outside[0]}")
    future = [node for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == "__future__"]
    if not future:
        raise BundleError("common.py must start with `from __future__ import annotations`, as the scripts do")
    lines = common.splitlines(keepends=True)
    return lines[future[-1].end_lineno :], _defined_names(tree.body)


def _defined_names(statements: list[ast.stmt]) -> set[str]:
    """Names a module's top level binds, imports aside (both files may import `os`)."""
    names: set[str] = set()
    for node in statements:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {leaf.id for leaf in ast.walk(target) if isinstance(leaf, ast.Name)}
        elif isinstance(node, ast.If | ast.Try | ast.With):
            nested = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                nested += handler.body
            names |= _defined_names(nested)
    return names


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in SCRIPTS:
        sys.stderr.write(f"usage: python -m nodekit.bundle {{{','.join(SCRIPTS)}}} > FILE.py\n")
        return 2
    sys.stdout.buffer.write(script_bytes(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
