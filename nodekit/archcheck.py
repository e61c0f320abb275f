#!/usr/bin/env python3
"""Binôme archcheck: before you book, do your compiled extensions carry code for the cards you would rent?

Run it on your own machine, with the Python of your training environment; no GPU is needed::

    python3 archcheck.py                         # the site-packages of this Python
    python3 archcheck.py PATH [PATH ...]         # site-packages directories, wheels (.whl), folders, .so files
    python3 archcheck.py --json report.json      # also write the report (JSON), to give on the booking page

It reads the device code of each shared object (its ``.nv_fatbin`` or ``.hip_fatbin`` section) with the reader of
the pre-flight check that runs in a rented container, without loading or running any of them, and says for each
class of Binôme: NVIDIA B200 (``sm_100``), NVIDIA H200 (``sm_90``), AMD MI300X (``gfx942``), whether each extension
has native code, only a fallback (PTX compiled by the driver at first launch; an AMD generic code object), or none;
and, for none, which extension to rebuild with which flag. NVIDIA's own runtime libraries (``nvidia/``: cuBLAS,
cuDNN…) are left out, as the pre-flight check leaves them: they load their kernels their own way.

The exit status is 0 when the report is written, 2 on a usage error (a path that cannot be read), with one line on
stderr. Standard library only; Python 3.9 or later.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile

from nodekit.common import now_utc, short_text
from nodekit.gpu_arch import (
    EXTENSION_MAX_FILES,
    VENDOR_RUNTIME_DIRS,
    ExtensionUnreadable,
    elf_sections,
    extension_coverage,
    fatbin_archs,
    offload_bundle_targets,
    site_packages_dirs,
)

SCHEMA = "binome.archcheck/1"
# (key, name, target, vendor, how an extension is rebuilt with code for it)
CLASSES = (
    (
        "b200",
        "NVIDIA B200",
        "sm_100",
        "nvidia",
        'TORCH_CUDA_ARCH_LIST="10.0" (nvcc: -gencode arch=compute_100,code=sm_100)',
    ),
    (
        "h200",
        "NVIDIA H200",
        "sm_90",
        "nvidia",
        'TORCH_CUDA_ARCH_LIST="9.0" (nvcc: -gencode arch=compute_90,code=sm_90)',
    ),
    ("mi300x", "AMD MI300X", "gfx942", "amd", "PYTORCH_ROCM_ARCH=gfx942 (hipcc: --offload-arch=gfx942), on ROCm"),
)
MAX_WHEEL_MEMBER_BYTES = 4 * 2**30  # a shared object in a wheel larger than this is not extracted
DEADLINE_S = 600.0
LISTED = 20


def _is_shared_object(name: str) -> bool:
    base = os.path.basename(name)
    return base.endswith(".so") or ".so." in base


def _outside_vendor_runtime(relative: str) -> bool:
    return relative.replace(os.sep, "/").split("/", 1)[0] not in VENDOR_RUNTIME_DIRS


def device_code(path: str) -> tuple[str | None, list[str], bool]:
    """(vendor, entries, compressed) of a shared object's device code; (None, [], False) when it has none. Read,
    never loaded."""
    with open(path, "rb") as handle:
        sections = elf_sections(handle)
        if ".nv_fatbin" in sections:
            return "nvidia", fatbin_archs(handle, *sections[".nv_fatbin"]), False
        if ".hip_fatbin" in sections:
            entries, compressed = offload_bundle_targets(handle, *sections[".hip_fatbin"])
            return "amd", entries, compressed
    return None, [], False


class Scan:
    """Every shared object read, with the device code of those that have some."""

    def __init__(self) -> None:
        self.read = 0
        self.extensions: list[dict] = []
        self.unreadable: list[dict] = []
        self.stopped = ""
        self.deadline = time.monotonic() + DEADLINE_S

    def full(self) -> bool:
        if self.read >= EXTENSION_MAX_FILES:
            self.stopped = f"stopped after {EXTENSION_MAX_FILES} shared objects"
        elif time.monotonic() > self.deadline:
            self.stopped = "stopped: out of time"
        return bool(self.stopped)

    def add(self, path: str, name: str) -> None:
        self.read += 1
        try:
            vendor, entries, compressed = device_code(path)
        except (OSError, ExtensionUnreadable, ValueError) as exc:  # struct.error is a ValueError
            self.unreadable.append({"name": name, "why": short_text(exc, 120)})
            return
        if vendor is None:
            return
        extension = {"name": name, "vendor": vendor, "archs": sorted(set(entries))[:12]}
        for key, _name, target, class_vendor, _rebuild in CLASSES:
            if class_vendor != vendor:
                extension[key] = "other_vendor"  # a CUDA build does not run on ROCm, nor the other way round
            elif compressed and extension_coverage(target, entries) == "missing":
                extension[key] = "unreadable"  # a compressed offload bundle: its targets are not listed
            else:
                extension[key] = extension_coverage(target, entries)
        self.extensions.append(extension)

    def directory(self, root: str, label: str) -> None:
        for directory, subdirectories, files in os.walk(root, followlinks=False):
            if directory == root:
                subdirectories[:] = [name for name in subdirectories if name not in VENDOR_RUNTIME_DIRS]
            subdirectories.sort()
            for name in sorted(files):
                path = os.path.join(directory, name)
                if not _is_shared_object(name) or os.path.islink(path) or not os.path.isfile(path):
                    continue
                if self.full():
                    return
                self.add(
                    path, os.path.join(label, os.path.relpath(path, root)) if label else os.path.relpath(path, root)
                )

    def wheel(self, path: str) -> None:
        """The shared objects of a wheel (a zip), each extracted alone to a temporary file, read, then removed."""
        label = os.path.basename(path)
        with zipfile.ZipFile(path) as wheel, tempfile.TemporaryDirectory(prefix="archcheck-") as scratch:
            for member in sorted(wheel.infolist(), key=lambda info: info.filename):
                if member.is_dir() or not _is_shared_object(member.filename):
                    continue
                if not _outside_vendor_runtime(member.filename) or self.full():
                    continue
                name = f"{label}:{member.filename}"
                if member.file_size > MAX_WHEEL_MEMBER_BYTES:
                    self.unreadable.append({"name": name, "why": f"larger than {MAX_WHEEL_MEMBER_BYTES} bytes"})
                    continue
                target = os.path.join(scratch, "member.so")
                with wheel.open(member) as source, open(target, "wb") as copy:
                    shutil.copyfileobj(source, copy, 2**20)
                self.add(target, name)
                os.unlink(target)


def verdicts(scan: Scan) -> dict:
    """Per class: `ready` (every extension has native code), `fallback` (some only a fallback), `not_ready` (one
    has none, or is built for the other vendor), `nothing_compiled` (no extension carries device code); with the
    extensions to rebuild."""
    classes = {}
    for key, name, target, _vendor, rebuild in CLASSES:
        missing = [extension["name"] for extension in scan.extensions if extension[key] == "missing"]
        other_vendor = [extension["name"] for extension in scan.extensions if extension[key] == "other_vendor"]
        fallback = [extension["name"] for extension in scan.extensions if extension[key] == "fallback"]
        unknown = [extension["name"] for extension in scan.extensions if extension[key] == "unreadable"]
        if missing or other_vendor:
            verdict = "not_ready"
        elif fallback or unknown:
            verdict = "fallback"
        elif scan.extensions:
            verdict = "ready"
        else:
            verdict = "nothing_compiled"
        classes[key] = {
            "name": name,
            "target": target,
            "verdict": verdict,
            "missing": missing,
            "other_vendor": other_vendor,
            "fallback": fallback,
            "unreadable": unknown,
            "rebuild_with": rebuild if missing else "",
        }
    return classes


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def summary(report: dict) -> str:
    lines = [
        f"archcheck: {report['read']} shared objects read, {len(report['extensions'])} with device code"
        + (f" ({report['stopped']})" if report["stopped"] else "")
    ]
    for key, *_rest in CLASSES:
        verdict = report["classes"][key]
        head = f"{verdict['name']} ({verdict['target']}): "
        if verdict["verdict"] == "nothing_compiled":
            lines.append(head + "nothing to check: no extension carries device code (pure Python, or CPU only)")
        elif verdict["verdict"] == "ready":
            lines.append(head + "ready: every extension has code for it")
        elif verdict["verdict"] == "fallback":
            parts = []
            if verdict["fallback"]:
                parts.append(
                    "only a fallback (compiled at first launch, or generic) in " + _listed(verdict["fallback"])
                )
            if verdict["unreadable"]:
                parts.append("targets not listed (compressed) in " + _listed(verdict["unreadable"]))
            lines.append(head + "runs, " + "; ".join(parts))
        else:
            parts = []
            if verdict["missing"]:
                parts.append(
                    f"no code for {verdict['target']} in {_listed(verdict['missing'])}: rebuild with "
                    f"{verdict['rebuild_with']}"
                )
            if verdict["other_vendor"]:
                other = "ROCm" if key == "mi300x" else "CUDA"
                names = _listed(verdict["other_vendor"])
                parts.append(f"built for the other vendor only in {names}: install their {other} build")
            lines.append(head + "NOT READY: " + "; ".join(parts))
    for item in report["unreadable"][:5]:
        lines.append(f"not readable: {item['name']} ({item['why']})")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="archcheck.py",
        description="Which of Binôme's cards (B200 sm_100, H200 sm_90, MI300X gfx942) your compiled extensions "
        "carry code for. Reads, never loads, the shared objects.",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        help="site-packages directories, wheels (.whl), folders or .so files (default: this Python's site-packages)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE ('-': standard output)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scan = Scan()
    paths = args.paths or site_packages_dirs()
    for path in paths:
        if not os.path.exists(path):
            sys.stderr.write(f"archcheck.py: error: no such file or directory: {short_text(path, 200)}\n")
            return 2
    for path in paths:
        if scan.stopped:
            break
        try:
            if os.path.isdir(path):
                scan.directory(path, "" if len(paths) == 1 else os.path.basename(os.path.normpath(path)))
            elif path.endswith(".whl") or zipfile.is_zipfile(path):
                scan.wheel(path)
            elif not scan.full():
                scan.add(path, os.path.basename(path))
        except (OSError, zipfile.BadZipFile) as exc:
            sys.stderr.write(f"archcheck.py: error: {short_text(path, 200)} cannot be read: {short_text(exc, 200)}\n")
            return 2
    report = {
        "schema": SCHEMA,
        "created_at": now_utc(),
        "python": sys.version.split()[0],
        "paths": [short_text(path, 300) for path in paths],
        "read": scan.read,
        "stopped": scan.stopped,
        "extensions": scan.extensions,
        "unreadable": scan.unreadable,
        "classes": verdicts(scan),
    }
    print(summary(report))
    if args.json == "-":
        print(json.dumps(report, indent=2))
    elif args.json:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.json)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
