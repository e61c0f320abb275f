"""The files shipped to the nodes: each script with the nodekit modules it imports inlined, one self-contained file.

A container runs a script as `python3 -I /opt/binome/preflight.py` (the order's kit), and a researcher downloads the
split-trial kit as one `split_trial.py`: neither has this package. So each of the script's `from nodekit.<module>
import …` lines (common.py for both; verdicts.py, gpu_arch.py, gpu_tools.py, preflight_checks.py,
preflight_worker.py for the pre-flight) is replaced by the body of that module, each module once and after the ones
it imports itself, and the result needs nothing but the standard library. A single .py file (rather than a zipapp)
keeps what people know: it can be read, downloaded under its own name, and run by path, and multiprocessing's spawn
children (the all-reduce ranks, the split-trial ranks) re-run it by that path.

The output depends only on the source files, never on the working directory or the machine. The build refuses what
would make the inlined file mean something else than the package: an aliased or unknown name, a script that defines
a name an inlined module defines (the inlined copy would be shadowed), two inlined modules defining the same name, a
circle of imports, or an import of nodekit anywhere else.

    python -m nodekit.bundle split_trial > split_trial.py     # the file the portal ships, to run by hand
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SCRIPTS = ("preflight", "split_trial", "archcheck")
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
    """The shipped file for `name` (one of SCRIPTS), UTF-8."""
    if name not in SCRIPTS:
        raise ValueError(f"no node script {name!r}: one of {', '.join(SCRIPTS)}")
    script = (PACKAGE_DIR / f"{name}.py").read_text(encoding="utf-8")
    return inline_modules(script, _module_sources(script, name), name=name).encode("utf-8")


def _module_sources(script: str, name: str) -> dict[str, str]:
    """The source of every nodekit module `script` imports, directly or through another one."""
    sources: dict[str, str] = {}
    pending = [(name, script)]
    while pending:
        importer, source = pending.pop()
        for module in _nodekit_imports(ast.parse(source)):
            if module not in sources:
                if module in (*SCRIPTS, "bundle") or not (PACKAGE_DIR / f"{module}.py").is_file():
                    raise BundleError(f"{importer}.py imports nodekit.{module}, which is not a helper module to inline")
                sources[module] = (PACKAGE_DIR / f"{module}.py").read_text(encoding="utf-8")
                pending.append((module, sources[module]))
    return sources


def inline(script: str, common: str, *, name: str) -> str:
    """`script` with its `from nodekit.common import …` replaced by the body of `common` (see the module doc)."""
    return inline_modules(script, {"common": common}, name=name)


def inline_modules(script: str, sources: dict[str, str], *, name: str) -> str:
    """`script` with its `from nodekit.<module> import …` lines replaced by the bodies of those modules (`sources`,
    by module name), each inlined once, after the modules it imports itself (see the module doc)."""
    tree = ast.parse(script)
    trees = {module: ast.parse(source) for module, source in sources.items()}
    imports = _checked_imports(tree, name)
    order: list[str] = []
    _visit(list(imports), trees, order, [name])
    lines = script.splitlines(keepends=True)
    header = f"# Built by nodekit/bundle.py from nodekit/{name}.py" + (
        f" and the helpers it imports from {', '.join(f'nodekit/{module}.py' for module in order)}\n" if order else "\n"
    )
    head = 1 if lines and lines[0].startswith("#!") else 0
    if not imports:
        return "".join([*lines[:head], header, *lines[head:]])
    owners: dict[str, str] = {}
    bodies = []
    for module in order:
        body, names = _module_body(sources[module], trees[module], module)
        _check_imported_names(_checked_imports(trees[module], module), trees, module)
        for clash in sorted(names & owners.keys()):
            raise BundleError(f"{owners[clash]}.py and {module}.py both define {clash}: one would shadow the other")
        owners.update(dict.fromkeys(names, module))
        bodies += [f"# ---- nodekit/{module}.py, inlined ----\n", *body, f"# ---- end of nodekit/{module}.py ----\n"]
    _check_imported_names(imports, trees, name)
    clashes = sorted(_defined_names(tree.body) & owners.keys())
    if clashes:
        inlined = ", ".join(sorted({f"{owners[clash]}.py" for clash in clashes}))
        raise BundleError(f"{name}.py defines {', '.join(clashes)} again: the inlined {inlined} would be shadowed")
    kept = _without(lines, list(imports.values()))
    first = min(statement.lineno for statement in imports.values()) - 1  # the helpers go where the first import was
    shipped = [*lines[:head], header]
    for index in range(head, len(lines)):
        if index == first:
            shipped += bodies
        if kept[index] is not None:
            shipped.append(kept[index])
    result = "".join(shipped)
    compile(result, f"{name}.py", "exec")  # a syntax error here is a bug of the build, not of the node
    return result


def _without(lines: list[str], statements: list[ast.stmt]) -> list[str | None]:
    """`lines` with those of `statements` replaced by None."""
    kept: list[str | None] = list(lines)
    for statement in statements:
        for index in range(statement.lineno - 1, statement.end_lineno):
            kept[index] = None
    return kept


def _nodekit_imports(tree: ast.Module) -> list[str]:
    return [
        node.module.split(".", 1)[1]
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("nodekit.")
    ]


def _checked_imports(tree: ast.Module, name: str) -> dict[str, ast.ImportFrom]:
    """{module: its one `from nodekit.<module> import …` statement} of a file; refuses any other nodekit import."""
    imports: dict[str, ast.ImportFrom] = {}
    top = [
        node
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("nodekit.")
    ]
    stray = [node for node in ast.walk(tree) if _imports_nodekit(node) and node not in top]
    if stray:
        raise BundleError(
            f"{name}.py line {stray[0].lineno}: only one `from nodekit.<module> import …` per module, at the top "
            "level, is inlined"
        )
    for node in top:
        module = node.module.split(".", 1)[1]
        if module in imports:
            raise BundleError(f"{name}.py imports from {node.module} more than once")
        imports[module] = node
    return imports


def _check_imported_names(imports: dict[str, ast.ImportFrom], trees: dict[str, ast.Module], name: str) -> None:
    for module, statement in imports.items():
        defined = _defined_names(trees[module].body)
        for alias in statement.names:
            if alias.asname or alias.name not in defined:
                raise BundleError(f"{name}.py: import {alias.name} from nodekit.{module} by its own name, no alias")


def _visit(modules: list[str], trees: dict[str, ast.Module], order: list[str], chain: list[str]) -> None:
    """Append each module after the modules it imports (depth first), each once; refuses a circle."""
    for module in modules:
        if module in chain:
            raise BundleError(f"nodekit modules import each other: {' -> '.join([*chain, module])}")
        if module not in order:
            if module not in trees:
                raise BundleError(f"{chain[-1]}.py imports nodekit.{module}, which is not a helper module to inline")
            _visit(_nodekit_imports(trees[module]), trees, order, [*chain, module])
            order.append(module)


def _imports_nodekit(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "nodekit" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "nodekit"
    return False


def _module_body(source: str, tree: ast.Module, module: str) -> tuple[list[str], set[str]]:
    """A helper module's lines after its docstring and `from __future__` line, its own nodekit imports taken out
    (those modules are inlined before it), and the names it defines. Imports are the standard library's, but for
    torch imported inside a function (lazily, as the scripts do) by a module other than common.py."""
    lazy = set()
    if module != COMMON_MODULE.split(".", 1)[1]:
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
        lazy = {id(inner) for function in functions for inner in ast.walk(function)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise BundleError(f"{module}.py line {node.lineno}: no relative import, the standard library only")
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            allowed = (*sys.stdlib_module_names, "nodekit", *(("torch",) if id(node) in lazy else ()))
            outside = [name for name in modules if name.split(".")[0] not in allowed]
            if outside:
                raise BundleError(f"{module}.py line {node.lineno}: the standard library only, not {outside[0]}")
    future = [node for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == "__future__"]
    if not future:
        raise BundleError(f"{module}.py must start with `from __future__ import annotations`, as the scripts do")
    own = [
        node for node in tree.body if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nodekit.")
    ]
    kept = _without(source.splitlines(keepends=True), own)
    return [line for line in kept[future[-1].end_lineno :] if line is not None], _defined_names(tree.body)


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
