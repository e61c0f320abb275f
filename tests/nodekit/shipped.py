"""The node scripts as a node receives them: nodekit.bundle's single files, each alone in a directory of its own.

Written once per test session into a temporary directory (removed at exit), far from the repository, so that a
run proves the file needs nothing beside it.
"""

import atexit
import functools
import importlib.util
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

from nodekit.bundle import script_bytes

_DIRECTORY = Path(tempfile.mkdtemp(prefix="binome-nodekit-"))
atexit.register(shutil.rmtree, _DIRECTORY, True)


@functools.cache
def shipped_script(name: str) -> Path:
    """The path of the shipped `name`.py ("preflight", "split_trial")."""
    path = _DIRECTORY / name / f"{name}.py"
    path.parent.mkdir()
    path.write_bytes(script_bytes(name))
    return path


def load_shipped(name: str) -> ModuleType:
    """The shipped file imported as a module (not as __main__), for its pure functions."""
    spec = importlib.util.spec_from_file_location(f"binome_{name}_under_test", shipped_script(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
