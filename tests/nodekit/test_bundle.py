"""nodekit.bundle: the shipped files stand alone (no nodekit, standard library only) and do not depend on where
they were built; the inliner refuses what would change a script's meaning."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodekit.bundle import SCRIPTS, BundleError, inline, inline_modules, script_bytes
from tests.nodekit.shipped import shipped_script

REPO = Path(__file__).resolve().parents[2]
HELP_LINES = {
    "preflight": "Binôme node pre-flight check: prints one JSON report on stdout; exit 0 pass, 1 fail, 2 usage.",
    "split_trial": "Binôme split trial: one card, then two (DDP, FSDP, pipeline), same data and precision",
    "archcheck": "Which of Binôme's cards (B200 sm_100, H200 sm_90, MI300X gfx942) your compiled extensions carry",
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_shipped_file_imports_the_standard_library_only_and_never_nodekit(name):
    tree = ast.parse(shipped_script(name).read_bytes())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import at line {node.lineno}"
            imported.add((node.module or "").split(".")[0])
    assert "nodekit" not in imported
    assert imported - {"torch"} <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_shipped_file_runs_alone_where_nodekit_cannot_be_imported(tmp_path, name):
    """`python3 -I -S` from a directory that holds nothing: sys.path is the standard library and nothing else."""
    isolated = [sys.executable, "-I", "-S"]
    probe = subprocess.run(
        [*isolated, "-c", "import importlib.util; print(importlib.util.find_spec('nodekit'))"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    assert probe.stdout.strip() == "None"  # else this test would prove nothing
    result = subprocess.run(
        [*isolated, str(shipped_script(name)), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {name}.py ")
    assert HELP_LINES[name] in " ".join(result.stdout.split())
    assert result.stderr == ""


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_shipped_bytes_do_not_depend_on_the_working_directory(tmp_path, name):
    code = f"import sys; from nodekit.bundle import script_bytes; sys.stdout.buffer.write(script_bytes({name!r}))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    built = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=cwd, env=env, check=True).stdout
        for cwd in (tmp_path, "/", REPO / "nodekit")
    ]
    assert built == [script_bytes(name)] * 3
    assert built[0].startswith(b"#!/usr/bin/env python3\n")
    assert str(REPO).encode() not in built[0] and str(tmp_path).encode() not in built[0]


def test_an_unknown_script_is_refused():
    with pytest.raises(ValueError, match="no node script"):
        script_bytes("../settings")


# ----------------------------------------------------------------------------------------------------------------
# The inliner, on small sources
# ----------------------------------------------------------------------------------------------------------------

COMMON = '''"""Shared."""

from __future__ import annotations

import os

LIMIT = 3


def shorten(text: str) -> str:
    return text[:LIMIT]
'''

SCRIPT = '''#!/usr/bin/env python3
"""A script."""

from __future__ import annotations

from nodekit.common import shorten


def main() -> str:
    return shorten("abcdef")
'''


def _run(source: str) -> dict:
    namespace: dict = {"__name__": "shipped"}
    exec(compile(source, "shipped.py", "exec"), namespace)  # noqa: S102 - our own test source
    return namespace


def test_the_common_module_is_inlined_in_place_of_its_import():
    shipped = inline(SCRIPT, COMMON, name="tool")
    lines = shipped.splitlines()
    assert lines[0] == "#!/usr/bin/env python3"
    assert lines[1].startswith("# Built by nodekit/bundle.py from nodekit/tool.py")
    assert lines[2] == '"""A script."""'  # still the module's docstring
    assert not [line for line in lines if "import" in line and "nodekit" in line and not line.startswith("#")]
    assert shipped.count("from __future__") == 1
    namespace = _run(shipped)
    assert namespace["main"]() == "abc"
    assert namespace["__doc__"] == "A script."


@pytest.mark.parametrize(
    ("script", "common", "needle"),
    [
        (SCRIPT.replace("import shorten", "import shorten as cut"), COMMON, "no alias"),
        (SCRIPT.replace("import shorten", "import lengthen"), COMMON, "no alias"),
        (SCRIPT + "\n\nLIMIT = 5\n", COMMON, "defines LIMIT again"),
        (SCRIPT + "\n\ndef shorten(text):\n    return text\n", COMMON, "defines shorten again"),
        (SCRIPT + "\n\ndef later():\n    import nodekit.bundle\n", COMMON, "only one"),
        (SCRIPT + "\nfrom nodekit.common import LIMIT\n", COMMON, "more than once"),
        (SCRIPT, COMMON.replace("import os", "import torch"), "standard library only, not torch"),
        (SCRIPT, COMMON.replace("import os", "from . import os"), "no relative import"),
        (SCRIPT, COMMON.replace("from __future__ import annotations", ""), "from __future__"),
    ],
    ids=["alias", "unknown", "clash", "clash-def", "stray", "twice", "torch", "relative", "no-future"],
)
def test_the_inliner_refuses_what_would_change_the_meaning(script, common, needle):
    with pytest.raises(BundleError, match=needle):
        inline(script, common, name="tool")


def test_a_script_without_the_common_import_ships_as_it_is_with_its_header():
    plain = SCRIPT.replace("from nodekit.common import shorten\n", "shorten = str\n")
    shipped = inline(plain, COMMON, name="tool")
    header, _ = shipped.split("\n", 2)[1:]
    assert header.startswith("# Built by nodekit/bundle.py")
    assert shipped.replace(header + "\n", "", 1) == plain


# A script's own helper module, which itself uses common.py: both inlined, common first, each once.
TOOLS = '''"""Tools."""

from __future__ import annotations

from nodekit.common import shorten


def label(text: str) -> str:
    return "[" + shorten(text) + "]"
'''

SCRIPT_WITH_TOOLS = SCRIPT.replace(
    "from nodekit.common import shorten\n", "from nodekit.common import shorten\nfrom nodekit.tools import label\n"
).replace('return shorten("abcdef")', 'return label("abcdef") + shorten("xyzw")')


def test_helper_modules_are_inlined_once_after_the_modules_they_import():
    shipped = inline_modules(SCRIPT_WITH_TOOLS, {"common": COMMON, "tools": TOOLS}, name="tool")

    assert shipped.splitlines()[1].endswith("imports from nodekit/common.py, nodekit/tools.py")
    assert shipped.index("def shorten") < shipped.index("def label") < shipped.index("def main")
    assert shipped.count("def shorten") == 1 and shipped.count("from __future__") == 1
    assert not [line for line in shipped.splitlines() if "import" in line and "nodekit" in line and "#" not in line]
    assert _run(shipped)["main"]() == "[abc]xyz"


@pytest.mark.parametrize(
    ("tools", "needle"),
    [
        (TOOLS + "\n\nLIMIT = 4\n", "common.py and tools.py both define LIMIT"),
        (TOOLS.replace("from nodekit.common import shorten", "from nodekit.tool import main"), "import each other"),
        (TOOLS.replace("import shorten", "import shorten as cut"), "no alias"),
        (TOOLS + "\nimport torch\n", "standard library only, not torch"),
        (TOOLS + "\n\ndef lazy():\n    import numpy\n", "standard library only, not numpy"),
    ],
    ids=["clash", "circle", "alias", "torch", "lazy-numpy"],
)
def test_the_inliner_refuses_a_helper_module_that_would_change_the_meaning(tools, needle):
    with pytest.raises(BundleError, match=needle):
        inline_modules(SCRIPT_WITH_TOOLS, {"common": COMMON, "tools": tools}, name="tool")


def test_a_helper_module_may_import_torch_lazily_but_common_may_not():
    lazy = "\n\ndef device():\n    import torch\n\n    return torch.device('cpu')\n"
    shipped = inline_modules(SCRIPT_WITH_TOOLS, {"common": COMMON, "tools": TOOLS + lazy}, name="tool")

    assert "    import torch\n" in shipped
    with pytest.raises(BundleError, match=r"common\.py line \d+: the standard library only, not torch"):
        inline_modules(SCRIPT_WITH_TOOLS, {"common": COMMON + lazy, "tools": TOOLS}, name="tool")


def test_the_preflight_ships_its_gpu_tools_inlined():
    shipped = script_bytes("preflight").decode()

    assert "# ---- nodekit/gpu_tools.py, inlined ----" in shipped and "def parse_nvidia_smi" in shipped


def test_the_preflight_ships_its_shared_names_and_its_torch_worker_inlined():
    shipped = script_bytes("preflight").decode()

    assert (
        shipped.index("# ---- nodekit/preflight_checks.py, inlined ----")
        < shipped.index("# ---- nodekit/preflight_worker.py, inlined ----")
        < shipped.index("class Supervisor")
    )
    assert shipped.count("\nclass Worker:") == 1 and shipped.count("\nWORKER_CHECKS = ") == 1


def test_the_readme_s_bundle_commands_run_as_written():
    """nodekit/README.md tells a developer how to build the shipped files by hand: typed as written from the
    repository's root, each writes the file the portal ships."""
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    commands = re.findall(
        r"^(\.venv/bin/python -m nodekit\.bundle (\w+) > (/tmp/\w+\.py))$",
        (root / "nodekit" / "README.md").read_text(),
        re.M,
    )
    assert {name for _command, name, _target in commands} == {"preflight", "split_trial"}
    for command, name, target in commands:
        ran = subprocess.run(["sh", "-c", command], cwd=root, capture_output=True, timeout=120, check=False)
        assert ran.returncode == 0, ran.stderr
        assert Path(target).read_bytes() == script_bytes(name)
