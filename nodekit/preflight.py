#!/usr/bin/env python3
"""Binôme pre-flight check: is this node fit to be handed to a researcher?

Shipped to the node on its own and run there, before the booking starts:

    python3 preflight.py --gpus 0,1 --expect-arch sm_100 --expect-vendor nvidia \
        [--matmul-size 8192] [--allreduce-mb 256] [--timeout 600]

It prints one JSON document (schema ``binome.preflight/1``) on stdout and nothing else; logs go to stderr.
Exit status: 0 when every check passed (WARN and SKIP do not fail a node), 1 when any check FAILed, 2 on bad
arguments (a message on stderr, nothing on stdout).

``--gpus`` are physical indices, as nvidia-smi / rocm-smi / amd-smi number the GPUs; the script maps them to the
indices torch sees through CUDA_VISIBLE_DEVICES (NVIDIA, under CUDA_DEVICE_ORDER=PCI_BUS_ID, which it sets when
unset so that torch and nvidia-smi number the GPUs alike) or ROCR_VISIBLE_DEVICES then HIP_VISIBLE_DEVICES (AMD).

Only the standard library is imported at module level: the node may have no torch, or a broken one. Everything
that touches torch runs in a worker process (this same file, ``--_worker``) that the supervisor watches: a torch
that segfaults on import, a GPU that hangs a kernel or a collective that never returns cannot take the report
with it. The supervisor kills the worker's whole process group (the all-reduce ranks included) at --timeout and
still prints a complete report, in which the check that was running says "timed out".
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import os
import platform
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback

from nodekit.common import (
    bounded,
    join_process_group,
    now_utc,
    rank_result,
    run_ranks,
    short_text,
    stderr_logger,
    synchronizer,
)

SCHEMA = "binome.preflight/1"
PASS, FAIL, SKIP, WARN = "PASS", "FAIL", "SKIP", "WARN"
CHECKS = (
    "gpu_visible",
    "driver",
    "torch_import",
    "accelerator_runtime",
    "arch_supported",
    "compiled_extensions",
    "bf16_matmul",
    "sdpa_attention",
    "checkpoint_roundtrip",
    "allreduce",
    "peak_memory",
)
# compiled_extensions runs in the supervisor: it reads files only, needs no torch, and a torch crash cannot stop it
SUPERVISOR_CHECKS = ("gpu_visible", "driver", "compiled_extensions")
WORKER_CHECKS = tuple(name for name in CHECKS if name not in SUPERVISOR_CHECKS)
ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")

NVIDIA_SMI_FIELDS = "index,uuid,name,driver_version,memory.total,memory.used,compute_cap"
# Older drivers do not know compute_cap: the query falls back to the fields every nvidia-smi has.
NVIDIA_SMI_FIELDS_OLD = "index,uuid,name,driver_version,memory.total,memory.used"

# Below these a result is a WARN, never a FAIL. They are deliberately low (roughly a third of the datasheet dense
# bf16 rate; NVLink/xGMI rates far above PCIe fallback) and still uncalibrated: tune them from real runs.
MATMUL_FLOOR_TFLOPS = {"sm_100": 750.0, "sm_90": 350.0, "gfx942": 400.0}
MATMUL_FLOOR_MIN_SIZE = 4096  # smaller matrices do not fill the GPU: no floor
ALLREDUCE_FLOOR_GBPS = {"sm_100": 200.0, "sm_90": 100.0, "gfx942": 20.0}
ALLREDUCE_FLOOR_MIN_MB = 64
BUSY_MEMORY_MIB = 2048  # memory already used on a GPU before the check starts: someone else is on it
MATMUL_TOLERANCE = 5e-2  # bf16 inputs, bf16 output, possibly bf16 split-K reductions; garbage is O(1)

# Minimum NVIDIA driver for a CUDA runtime major version under minor-version compatibility.
CUDA_MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}

# AMD generic code objects (code object v6): which processors each one runs on.
AMD_GENERIC_TARGETS = {
    "gfx9-generic": {"gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"},
    "gfx9-4-generic": {"gfx940", "gfx941", "gfx942", "gfx950"},
    "gfx10-1-generic": {"gfx1010", "gfx1011", "gfx1012", "gfx1013"},
    "gfx10-3-generic": {"gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036"},
    "gfx11-generic": {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"},
    "gfx12-generic": {"gfx1200", "gfx1201"},
}

# SDPA against softmax(QK^T/sqrt(d))V computed in fp32: max |difference| / max |reference|, by input dtype.
SDPA_TOLERANCE = {"float32": 5e-4, "float16": 1e-2, "bfloat16": 5e-2}  # garbage is O(1)

_SEVERITY = {PASS: 0, SKIP: 1, WARN: 2, FAIL: 3}


log = stderr_logger("preflight")  # everything human-readable goes to stderr: stdout carries the JSON report only


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


def _worst(*statuses: str) -> str:
    return max(statuses, key=_SEVERITY.__getitem__) if statuses else PASS


def _zip(*lists):
    """zip(strict=True) for Python 3.9, which nodes may still run."""
    if len({len(items) for items in lists}) > 1:
        raise ValueError(f"per-GPU lists of different lengths: {[len(items) for items in lists]}")
    return zip(*lists)  # noqa: B905 - lengths checked above


# --------------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------------

_ARCH_RE = re.compile(r"^(sm_\d{2,3}|gfx[0-9a-f]{3,4})$")


def _is_index(text: str) -> bool:
    """ASCII digits only: `str.isdigit()` also accepts "²", which `int()` refuses."""
    return text.isascii() and text.isdigit()


def _gpu_list(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",")]
    if not parts or any(not _is_index(part) for part in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU indices like 0,1, got {text!r}")
    gpus = [int(part) for part in parts]
    if len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"GPU indices repeat in {text!r}")
    return gpus


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="preflight.py",
        description="Binôme node pre-flight check: prints one JSON report on stdout; exit 0 pass, 1 fail, 2 usage.",
    )
    parser.add_argument("--gpus", required=True, type=_gpu_list, help="physical GPU indices, e.g. 0,1")
    parser.add_argument("--expect-arch", required=True, help="sm_100 (B200), sm_90 (H200), gfx942 (MI300X), …")
    parser.add_argument("--expect-vendor", required=True, choices=("nvidia", "amd"))
    parser.add_argument("--matmul-size", type=bounded(int, 16, 65536), default=8192, help="N of the bf16 N×N matmul")
    parser.add_argument("--allreduce-mb", type=bounded(int, 1, 65536), default=256, help="all-reduce size in MiB")
    parser.add_argument("--timeout", type=bounded(float, 1.0, 86400.0), default=600.0, help="seconds, whole run")
    parser.add_argument(
        "--site-packages",
        action="append",
        metavar="DIR",
        help="where to look for compiled extensions (repeatable); default: this Python's site-packages",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.expect_arch = args.expect_arch.strip().lower()
    if not _ARCH_RE.match(args.expect_arch):
        parser.error(f"--expect-arch: expected sm_XY[Z] or gfxNNN, got {args.expect_arch!r}")
    arch_vendor = "nvidia" if args.expect_arch.startswith("sm_") else "amd"
    if arch_vendor != args.expect_vendor:
        parser.error(f"--expect-arch {args.expect_arch} is an {arch_vendor} arch, not {args.expect_vendor}")
    return args


# --------------------------------------------------------------------------------------------------------------
# Architecture coverage (pure functions: unit-tested on their own)
# --------------------------------------------------------------------------------------------------------------

_CUDA_ARCH_RE = re.compile(r"^(sm|compute)_(\d{2,3})([af]?)$")


def _cuda_cc(digits: str) -> tuple[int, int]:
    return int(digits[:-1]), int(digits[-1])


def parse_cuda_arch(name: str) -> tuple[str, tuple[int, int], str] | None:
    """'sm_100a' -> ('sm', (10, 0), 'a'); 'compute_90' -> ('compute', (9, 0), ''); anything else -> None."""
    match = _CUDA_ARCH_RE.match(name.strip().lower())
    if not match:
        return None
    return match.group(1), _cuda_cc(match.group(2)), match.group(3)


def _cuda_entry_runs_on(entry: str, device: tuple[int, int]) -> str | None:
    """How a torch arch-list entry runs on a device of compute capability `device`: 'native', 'jit' or None.

    - sm_XY (SASS) runs on the same major with the same or a higher minor (sm_80 cubins run on sm_86), never
      across majors: sm_90 code does not run on sm_100, sm_100 code does not run on sm_120.
    - sm_XYa (arch-specific features) runs on exactly X.Y.
    - sm_XYf (family-specific, CUDA 12.9+) runs on the same major with the same or a higher minor.
    - compute_XY (PTX) is JIT-compiled by the driver for any device of capability >= X.Y; compute_XYa only for
      X.Y, compute_XYf for the family. JIT works but the first launch of each kernel compiles it.
    """
    parsed = parse_cuda_arch(entry)
    if parsed is None:
        return None
    kind, (major, minor), suffix = parsed
    if suffix == "a":
        ok = (major, minor) == device
    elif suffix == "f" or kind == "sm":
        ok = major == device[0] and minor <= device[1]
    else:
        ok = (major, minor) <= device
    if not ok:
        return None
    return "native" if kind == "sm" else "jit"


def _amd_split(name: str) -> tuple[str, dict[str, str]]:
    """'gfx942:sramecc+:xnack-' -> ('gfx942', {'sramecc': '+', 'xnack': '-'})."""
    base, *features = name.strip().lower().split(":")
    flags = {feature[:-1]: feature[-1] for feature in features if feature and feature[-1] in "+-"}
    return base, flags


def _amd_entry_runs_on(entry: str, device: str) -> str | None:
    """AMD code objects are per ISA: gfx942 code runs on gfx942 only (target features must not contradict the
    device's: an xnack+ object does not load on an xnack- GPU; a feature the object leaves unset runs on either).
    A generic target (gfx9-4-generic covers gfx940/941/942/950) loads too, with fewer instructions: 'generic'."""
    base, flags = _amd_split(entry)
    dev_base, dev_flags = _amd_split(device)
    for feature, sign in flags.items():
        if feature in dev_flags and dev_flags[feature] != sign:
            return None
    if base == dev_base:
        return "native"
    if dev_base in AMD_GENERIC_TARGETS.get(base, ()):
        return "generic"
    return None


def arch_coverage(target: str, arch_list: list[str]) -> tuple[str, str]:
    """Does torch's arch list (torch.cuda.get_arch_list()) have kernels for `target` (sm_100, sm_90, gfx942…)?

    PASS: native code (a SASS cubin or a gfx code object for it). WARN: only PTX to JIT (NVIDIA) or only a
    generic code object (AMD): it runs, but slower to start or with fewer instructions. FAIL: nothing runs there.
    """
    if not arch_list:
        return FAIL, f"the arch list is empty: no GPU kernels in this torch, so none for {target}"
    listed = ", ".join(arch_list)
    if target.startswith("sm_"):
        device = _cuda_cc(target[3:])
        kinds = {entry: _cuda_entry_runs_on(entry, device) for entry in arch_list}
    else:
        kinds = {entry: _amd_entry_runs_on(entry, target) for entry in arch_list}
    native = [entry for entry, kind in kinds.items() if kind == "native"]
    fallback = [entry for entry, kind in kinds.items() if kind in ("jit", "generic")]
    if native:
        return PASS, f"{target} covered natively by {', '.join(native)}"
    if fallback:
        how = "PTX JIT-compiled at first launch (slow start)" if target.startswith("sm_") else "a generic ISA"
        return WARN, f"{target} covered only by {', '.join(fallback)}: {how}; arch list: {listed}"
    return FAIL, f"no kernels for {target} in the arch list [{listed}]"


def torch_arch_list(torch) -> list[str]:
    """The archs torch was compiled for. torch.cuda.get_arch_list() answers [] whenever no GPU is usable, so a
    CUDA/ROCm build on a node whose driver is broken falls back to the compile-time flags it reads."""
    arch_list: list[str] = []
    try:
        arch_list = list(torch.cuda.get_arch_list())
    except Exception as exc:
        log(f"torch.cuda.get_arch_list() failed: {exc}")
    if not arch_list:
        flags = getattr(getattr(torch, "_C", None), "_cuda_getArchFlags", None)
        with contextlib.suppress(Exception):
            arch_list = (flags() or "").split() if flags else []
    return arch_list


def cuda_capability_name(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


# --------------------------------------------------------------------------------------------------------------
# Compiled extensions: device code in the image's shared objects, read from their ELF sections, never loaded
# --------------------------------------------------------------------------------------------------------------

EXTENSION_MAX_FILES = 5000  # shared objects examined, all site-packages together
EXTENSION_MAX_SECTION_HEADERS = 4096
EXTENSION_MAX_ENTRIES = 20000  # fatbin entries or bundle members per file
EXTENSION_MAX_SCAN_BYTES = 512 * 2**20  # bytes of one .hip_fatbin section searched for bundles
EXTENSION_NAMES_LISTED = 20
# Top-level site-packages directories of the vendors' own runtime libraries (NVIDIA's CUDA wheels: cuBLAS, cuFFT,
# cuDNN…). They load their kernels through their own containers: on an H200, torch 2.11+cu130's libcufft.so.12
# (286 MB) carries a single sm_75 cubin in .nv_fatbin, as cuobjdump says too, yet runs on every card its CUDA
# release supports. The CUDA version is checked by accelerator_runtime; extensions are what this check is for.
VENDOR_RUNTIME_DIRS = ("nvidia",)
FATBIN_MAGIC = 0xBA55ED50
FATBIN_KINDS = {1: "compute", 2: "sm"}  # 1: PTX, 2: ELF cubin
# Bit of an entry's flags (u64 at +40) set on arch-specific code (sm_90a, sm_100a): read from torch 2.11+cu130's
# libtorch_cuda.so on an H200, where its count matched cuobjdump --list-elf's sm_XYa cubins exactly.
FATBIN_ARCH_SPECIFIC_FLAG = 1 << 20
OFFLOAD_BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_BUNDLE_MAGIC = b"CCOB"


class ExtensionUnreadable(ValueError):
    """A shared object whose device-code section cannot be parsed within the bounds."""


def elf_sections(handle) -> dict[str, tuple[int, int]]:
    """Section name -> (file offset, size) of an ELF file, from its headers only; {} when it is not ELF."""
    import struct

    ident = handle.read(64)
    if len(ident) < 52 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        return {}
    endian = "<" if ident[5] == 1 else ">"
    if ident[4] == 2:
        (table,) = struct.unpack_from(endian + "Q", ident, 0x28)
        entry_size, count, names_index = struct.unpack_from(endian + "HHH", ident, 0x3A)
        layout, wanted = endian + "IIQQQQ", 40
    else:
        (table,) = struct.unpack_from(endian + "I", ident, 0x20)
        entry_size, count, names_index = struct.unpack_from(endian + "HHH", ident, 0x2E)
        layout, wanted = endian + "IIIIII", 24
    if count == 0 or count > EXTENSION_MAX_SECTION_HEADERS or entry_size < wanted or names_index >= count:
        return {}
    handle.seek(table)
    raw = handle.read(entry_size * count)
    if len(raw) < entry_size * count:
        raise ExtensionUnreadable("truncated section header table")
    headers = [struct.unpack_from(layout, raw, i * entry_size) for i in range(count)]
    _, _, _, _, names_offset, names_size = headers[names_index]
    handle.seek(names_offset)
    names = handle.read(min(names_size, 2**20))
    sections = {}
    for name_at, kind, _, _, offset, size in headers:
        if kind == 8:  # SHT_NOBITS: nothing in the file
            continue
        end = names.find(b"\0", name_at)
        if name_at < len(names) and end > 0:
            sections[names[name_at:end].decode("ascii", "replace")] = (offset, size)
    return sections


def fatbin_archs(handle, offset: int, size: int) -> list[str]:
    """The entries of an .nv_fatbin section, as cuobjdump lists them: 'sm_90' for a cubin, 'compute_90' for PTX.

    The section holds one or more fatbins: a 16-byte header (magic 0xBA55ED50, version, header size, size of the
    entries), then entries each with a header (kind 1 PTX / 2 ELF, header size, payload size, …, arch at +28,
    flags at +40 where FATBIN_ARCH_SPECIFIC_FLAG marks sm_XYa code)."""
    import struct

    archs, position, end, entries = [], offset, offset + size, 0
    while position + 16 <= end:
        handle.seek(position)
        header = handle.read(16)
        magic, _version, header_size, fat_size = struct.unpack("<IHHQ", header)
        if magic != FATBIN_MAGIC:
            if header[:8] == b"\0" * 8:  # padding between fatbins
                position += 8
                continue
            raise ExtensionUnreadable(f"no fatbin header at section offset {position - offset}")
        entry, entries_end = position + header_size, min(position + header_size + fat_size, end)
        while entry + 48 <= entries_end:
            entries += 1
            if entries > EXTENSION_MAX_ENTRIES:
                raise ExtensionUnreadable(f"more than {EXTENSION_MAX_ENTRIES} fatbin entries")
            handle.seek(entry)
            raw = handle.read(48)
            if len(raw) < 48:
                raise ExtensionUnreadable("a fatbin entry header is cut short")
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", raw)
            (arch,) = struct.unpack_from("<I", raw, 28)
            (flags,) = struct.unpack_from("<Q", raw, 40)
            if entry_header < 48:
                raise ExtensionUnreadable("fatbin entry header shorter than 48 bytes")
            if entry + entry_header + payload > entries_end:
                raise ExtensionUnreadable("a fatbin entry runs past its fatbin")
            if kind in FATBIN_KINDS and 10 <= arch <= 999:
                suffix = "a" if flags & FATBIN_ARCH_SPECIFIC_FLAG else ""
                archs.append(f"{FATBIN_KINDS[kind]}_{arch}{suffix}")
            entry += entry_header + payload
        position += header_size + fat_size
    if not archs:
        raise ExtensionUnreadable("no readable fatbin entry")
    return archs


def offload_bundle_targets(handle, offset: int, size: int) -> tuple[list[str], bool]:
    """The device targets (gfx942:sramecc+:xnack-) of the clang offload bundles in a .hip_fatbin section, and
    whether some bundle was compressed (CCOB: its names are not readable without decompressing it)."""
    import struct

    targets, compressed, entries = [], False, 0
    handle.seek(offset)
    data = handle.read(min(size, EXTENSION_MAX_SCAN_BYTES))
    position = 0
    while True:
        found = [at for at in (data.find(OFFLOAD_BUNDLE_MAGIC, position), data.find(COMPRESSED_BUNDLE_MAGIC, position))]
        found = [at for at in found if at >= 0]
        if not found:
            break
        at = min(found)
        if data.startswith(COMPRESSED_BUNDLE_MAGIC, at):
            compressed = True
            position = at + len(COMPRESSED_BUNDLE_MAGIC)
            continue
        cursor = at + len(OFFLOAD_BUNDLE_MAGIC)
        if cursor + 8 > len(data):
            break
        (count,) = struct.unpack_from("<Q", data, cursor)
        cursor += 8
        for _ in range(count):
            entries += 1
            if entries > EXTENSION_MAX_ENTRIES or cursor + 24 > len(data):
                raise ExtensionUnreadable("offload bundle table out of bounds")
            _member_offset, _member_size, name_size = struct.unpack_from("<QQQ", data, cursor)
            cursor += 24
            if name_size > 4096 or cursor + name_size > len(data):
                raise ExtensionUnreadable("offload bundle member name out of bounds")
            triple = data[cursor : cursor + name_size].decode("ascii", "replace")
            cursor += name_size
            kind, _, target = triple.partition("--")
            if "amdgcn" in kind and target:
                targets.append(target)
        position = cursor
    return targets, compressed


def extension_coverage(target: str, entries: list[str]) -> str:
    """'native' when some entry runs natively on `target`, 'fallback' when only PTX (JIT) or a generic AMD code
    object does, 'missing' otherwise."""
    if target.startswith("sm_"):
        kinds = {_cuda_entry_runs_on(entry, _cuda_cc(target[3:])) for entry in entries}
    else:
        kinds = {_amd_entry_runs_on(entry, target) for entry in entries}
    if "native" in kinds:
        return "native"
    return "fallback" if kinds & {"jit", "generic"} else "missing"


def site_packages_dirs() -> list[str]:
    """Where the image's Python packages live: sysconfig's library paths and the site-packages on sys.path."""
    import sysconfig

    candidates = [sysconfig.get_paths().get(key) for key in ("purelib", "platlib")]
    with contextlib.suppress(Exception):
        import site

        candidates += site.getsitepackages()
    candidates += [entry for entry in sys.path if entry.rstrip("/").endswith(("site-packages", "dist-packages"))]
    roots: list[str] = []
    for candidate in candidates:
        if candidate and os.path.isdir(candidate):
            real = os.path.realpath(candidate)
            if not any(real == root or real.startswith(root + os.sep) for root in roots):
                roots.append(real)
    return roots


def _shared_objects(roots: list[str], deadline: float):
    """Regular files named *.so or *.so.N under `roots`, links not followed, at most EXTENSION_MAX_FILES of them;
    yields (root, path) then, when a bound stopped the walk, (None, why)."""
    seen = 0
    for root in roots:
        for directory, subdirectories, files in os.walk(root, followlinks=False):
            if directory == root:
                subdirectories[:] = [name for name in subdirectories if name not in VENDOR_RUNTIME_DIRS]
            subdirectories.sort()
            for name in sorted(files):
                if not (name.endswith(".so") or ".so." in name):
                    continue
                path = os.path.join(directory, name)
                with contextlib.suppress(OSError):
                    if not os.path.isfile(path) or os.path.islink(path):
                        continue
                    if seen >= EXTENSION_MAX_FILES:
                        yield None, f"stopped after {EXTENSION_MAX_FILES} shared objects"
                        return
                    if time.monotonic() > deadline:
                        yield None, "stopped: out of time"
                        return
                    seen += 1
                    yield root, path


def scan_extensions(roots: list[str], target: str, vendor: str, deadline: float) -> dict:
    """Each shared object with device code for `vendor`, classified for `target`. Files are opened and read,
    never loaded or executed."""
    section = ".nv_fatbin" if vendor == "nvidia" else ".hip_fatbin"
    found = {"native": [], "fallback": [], "missing": [], "unreadable": []}
    scanned, stopped = 0, None
    for root, path in _shared_objects(roots, deadline):
        if root is None:
            stopped = path
            break
        scanned += 1
        name = os.path.relpath(path, root)
        try:
            with open(path, "rb") as handle:
                sections = elf_sections(handle)
                if section not in sections:
                    continue
                offset, size = sections[section]
                if vendor == "nvidia":
                    entries, compressed = fatbin_archs(handle, offset, size), False
                else:
                    entries, compressed = offload_bundle_targets(handle, offset, size)
        except (OSError, ExtensionUnreadable, ValueError) as exc:  # struct.error is a ValueError
            found["unreadable"].append({"name": name, "why": short_text(exc, 120)})
            continue
        coverage = extension_coverage(target, entries)
        if coverage == "missing" and compressed:
            found["unreadable"].append({"name": name, "why": "compressed offload bundle"})
            continue
        found[coverage].append({"name": name, "archs": sorted(set(entries))[:12]})
    return {"scanned": scanned, "stopped": stopped, **found}


def _named(items: list[dict], with_archs: bool = True) -> str:
    shown = items[:EXTENSION_NAMES_LISTED]
    parts = [
        f"{item['name']} ({', '.join(item['archs']) or 'no entries'})" if with_archs else f"{item['name']}"
        for item in shown
    ]
    more = f" and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
    return ", ".join(parts) + more


def extensions_verdict(scan: dict, target: str) -> tuple[str, str]:
    with_code = sum(len(scan[key]) for key in ("native", "fallback", "missing", "unreadable"))
    head = f"{scan['scanned']} shared objects read, {with_code} with device code"
    problems, warnings_ = [], []
    if scan["missing"]:
        problems.append(f"no code for {target} in {_named(scan['missing'])}")
    if scan["fallback"]:
        how = "only PTX, JIT-compiled by the driver at first launch" if target.startswith("sm_") else "generic only"
        warnings_.append(f"{how}: {_named(scan['fallback'])}")
    if scan["unreadable"]:
        warnings_.append(
            "not readable: " + ", ".join(f"{item['name']} ({item['why']})" for item in scan["unreadable"][:5])
        )
    if scan["stopped"]:
        warnings_.append(scan["stopped"])
    if problems:
        return FAIL, "; ".join([head, *problems, *warnings_])
    if warnings_:
        return WARN, "; ".join([head, *warnings_])
    if not with_code:
        return SKIP, f"{head}: no compiled extension carries device code"
    return PASS, f"{head}, each with code for {target}: {_named(scan['native'], with_archs=False)}"


# --------------------------------------------------------------------------------------------------------------
# GPU tools (nvidia-smi, amd-smi, rocm-smi) and the visible-devices filtering
# --------------------------------------------------------------------------------------------------------------


def run_tool(argv: list[str], timeout: float) -> dict:
    """Run a node tool; never raises and never waits (much) past `timeout`, even if the tool hangs in the driver."""
    exe = shutil.which(argv[0])
    if exe is None:
        return {"found": False, "rc": None, "out": "", "err": f"{argv[0]} not found on PATH"}
    if timeout <= 0:
        return {"found": True, "rc": None, "out": "", "err": f"no time left to run {argv[0]} (--timeout)"}
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv is ours, no shell
            [exe, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return {"found": True, "rc": None, "out": "", "err": f"cannot run {exe}: {exc}"}
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.1))
    except BaseException as exc:  # timed out, or we are being interrupted: the tool must not outlive us
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=2)
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        return {"found": True, "rc": None, "out": "", "err": f"{argv[0]} timed out after {timeout:.0f} s"}
    return {"found": True, "rc": proc.returncode, "out": out or "", "err": err or ""}


def _na(value: str) -> str | None:
    value = value.strip()
    return None if not value or value.startswith("[") or value.upper() in ("N/A", "NA") else value


def _int_or_none(value) -> int | None:
    try:
        return int(float(str(value).strip()))
    except (TypeError, ValueError):
        return None


def parse_nvidia_smi(text: str) -> list[dict]:
    """Rows of `nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total,memory.used[,compute_cap]
    --format=csv,noheader,nounits`."""
    gpus = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if len(row) < 6 or not _is_index(row[0].strip()):
            continue
        cap = _na(row[6]) if len(row) > 6 else None
        arch = None
        if cap and re.match(r"^\d+\.\d$", cap):
            major, minor = cap.split(".")
            arch = f"sm_{major}{minor}"
        gpus.append(
            {
                "index": int(row[0]),
                "uuid": _na(row[1]),
                "name": _na(row[2]) or "unknown",
                "driver": _na(row[3]),
                "memory_total_mib": _int_or_none(_na(row[4])),
                "memory_used_mib": _int_or_none(_na(row[5])),
                "arch": arch,
            }
        )
    return gpus


def _json_from(text: str):
    """The JSON document in a tool's output (rocm-smi may print warnings first)."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        raise ValueError("no JSON in the output")
    return json.loads(text[min(starts) :])


def _lookup(mapping: dict, *names: str):
    lowered = {str(key).strip().lower(): value for key, value in mapping.items()}
    for name in names:
        if name in lowered and lowered[name] not in (None, "", "N/A"):
            return lowered[name]
    return None


def parse_rocm_smi(text: str) -> list[dict]:
    """`rocm-smi --showproductname --showmeminfo vram --showdriverversion --showuniqueid --json`:
    {"card0": {"Card Series": "AMD Instinct MI300X", "GFX Version": "gfx942", "VRAM Total Memory (B)": "…"},
     "system": {"Driver version": "6.7.0"}}."""
    document = _json_from(text)
    cards: dict[str, dict] = {}
    system: dict = {}
    for key, value in document.items():
        if not isinstance(value, dict):
            continue
        if re.match(r"^card\d+$", key.lower()):
            cards[key] = value
        elif key.lower() == "system":
            system = value
            cards.update(
                {k: v for k, v in value.items() if re.match(r"^card\d+$", str(k).lower()) and isinstance(v, dict)}
            )
    driver = _lookup(system, "driver version")
    gpus = []
    for key, card in sorted(cards.items(), key=lambda item: int(re.sub(r"\D", "", item[0]))):
        total_b = _int_or_none(_lookup(card, "vram total memory (b)"))
        used_b = _int_or_none(_lookup(card, "vram total used memory (b)"))
        gfx = _lookup(card, "gfx version", "target graphics version")
        gpus.append(
            {
                "index": int(re.sub(r"\D", "", key)),
                "uuid": _lookup(card, "unique id"),
                "name": _lookup(card, "card series", "device name", "marketing name", "card model") or "unknown",
                "driver": _lookup(card, "driver version") or driver,
                "memory_total_mib": None if total_b is None else total_b // 2**20,
                "memory_used_mib": None if used_b is None else used_b // 2**20,
                "arch": str(gfx).lower() if gfx else None,
            }
        )
    return gpus


def _mib(value) -> int | None:
    """amd-smi sizes: {"value": 196592, "unit": "MB"}, "196592 MB" or a bare number of MB (which are MiB)."""
    if isinstance(value, dict):
        number, unit = value.get("value"), str(value.get("unit", "MB"))
    else:
        match = re.match(r"^\s*([\d.]+)\s*([A-Za-z]*)", str(value))
        if not match:
            return None
        number, unit = match.group(1), match.group(2) or "MB"
    number = _int_or_none(number)
    if number is None:
        return None
    scale = {"b": 1 / 2**20, "kb": 1 / 1024, "mb": 1, "gb": 1024, "mib": 1, "gib": 1024}.get(unit.lower(), 1)
    return int(number * scale)


def parse_amd_smi(text: str) -> list[dict]:
    """`amd-smi static --asic --vram --driver --json`: a list of GPUs, or {"gpu_data": [...]} in newer releases."""
    document = _json_from(text)
    if isinstance(document, dict):
        document = document.get("gpu_data") or document.get("gpus") or []
    gpus = []
    for position, item in enumerate(document):
        if not isinstance(item, dict):
            continue
        asic = item.get("asic") if isinstance(item.get("asic"), dict) else {}
        vram = item.get("vram") if isinstance(item.get("vram"), dict) else {}
        driver = item.get("driver") if isinstance(item.get("driver"), dict) else {}
        index = _int_or_none(item.get("gpu"))
        gpus.append(
            {
                "index": position if index is None else index,
                "uuid": item.get("uuid") if isinstance(item.get("uuid"), str) else None,
                "name": asic.get("market_name") or "unknown",
                "driver": driver.get("version") or driver.get("driver_version"),
                "memory_total_mib": _mib(vram.get("size") or vram.get("vram_size") or vram.get("vram_total") or ""),
                "memory_used_mib": None,
                "arch": (asic.get("target_graphics_version") or "").lower() or None,
            }
        )
    return gpus


def _visible_tokens(value: str) -> list[str]:
    """CUDA/HIP parse a visible-devices list up to the first entry that is not an index or a UUID."""
    tokens = []
    for raw in value.split(","):
        token = raw.strip()
        if _is_index(token) or re.match(r"^(GPU|MIG)-[0-9A-Za-z-]+$", token, re.IGNORECASE):
            tokens.append(token)
        else:
            break
    return tokens


def _same_uuid(token: str, uuid: str | None) -> bool:
    if not uuid:
        return False

    def hexdigits(text: str) -> str:
        text = text.lower()
        for prefix in ("gpu-", "mig-", "0x"):
            text = text.removeprefix(prefix)
        return text.replace("-", "")

    wanted, actual = hexdigits(token), hexdigits(uuid)
    return bool(wanted) and actual.startswith(wanted)  # CUDA accepts any unique UUID prefix


def _position(tokens: list[str], physical: int, uuid: str | None) -> int | None:
    for position, token in enumerate(tokens):
        if (_is_index(token) and int(token) == physical) or (not _is_index(token) and _same_uuid(token, uuid)):
            return position
    return None


def visible_mapping(vendor: str, gpus: list[int], env: dict, uuids: dict[int, str | None]) -> tuple[dict, str]:
    """Physical index -> the index torch will use (None: hidden by the environment), and the filter in words."""
    if vendor == "nvidia":
        value = env.get("CUDA_VISIBLE_DEVICES")
        if value is None:
            return {gpu: gpu for gpu in gpus}, "CUDA_VISIBLE_DEVICES unset"
        tokens = _visible_tokens(value)
        return {gpu: _position(tokens, gpu, uuids.get(gpu)) for gpu in gpus}, f"CUDA_VISIBLE_DEVICES={value}"
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    hip_name = "HIP_VISIBLE_DEVICES" if env.get("HIP_VISIBLE_DEVICES") is not None else "CUDA_VISIBLE_DEVICES"
    hip = env.get(hip_name)
    described = []
    if rocr is None:
        after_rocr = {gpu: gpu for gpu in gpus}
    else:
        tokens = _visible_tokens(rocr)
        after_rocr = {gpu: _position(tokens, gpu, uuids.get(gpu)) for gpu in gpus}
        described.append(f"ROCR_VISIBLE_DEVICES={rocr}")
    if hip is None:
        mapping = after_rocr
    else:
        tokens = [token for token in _visible_tokens(hip) if _is_index(token)]  # HIP indexes what ROCr exposes
        mapping = {gpu: None if after_rocr[gpu] is None else _position(tokens, after_rocr[gpu], None) for gpu in gpus}
        described.append(f"{hip_name}={hip}")
    return mapping, ", ".join(described) or "ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES unset"


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    numbers = re.findall(r"\d+", text)
    return tuple(int(n) for n in numbers[:3]) if numbers else None


# --------------------------------------------------------------------------------------------------------------
# Supervisor: stdlib only, owns stdout, the deadline and the report
# --------------------------------------------------------------------------------------------------------------


class _Stop(Exception):
    """SIGTERM/SIGINT: finish the report with what we have."""


class Supervisor:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.vendor = args.expect_vendor
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.timeout
        self.env_seen = {key: os.environ.get(key) for key in ENV_KEYS}
        self.checks: dict[str, dict] = {}
        self.tool_gpus: dict[int, dict] = {}
        self.logical: dict[int, int | None] = {gpu: gpu for gpu in args.gpus}
        self.driver: str | None = None
        self.worker: subprocess.Popen | None = None
        self.report = {
            "schema": SCHEMA,
            "started_at": now_utc(),
            "duration_s": None,
            "hostname": socket.gethostname(),
            "python": platform.python_version(),
            "requested": {
                "gpus": list(args.gpus),
                "expect_arch": args.expect_arch,
                "expect_vendor": args.expect_vendor,
                "matmul_size": args.matmul_size,
                "allreduce_mb": args.allreduce_mb,
                "timeout_s": args.timeout,
                "site_packages": list(args.site_packages or []),
            },
            "environment": dict(self.env_seen),
            "gpu": {
                "tool": None,
                "count": 0,
                "models": [],
                "driver": None,
                "memory_total_mib": [None] * len(args.gpus),
            },
            "stack": {"torch": None, "cuda": None, "hip": None, "arch_list": [], "device_capabilities": []},
            "results": {
                "bf16_matmul_tflops": [None] * len(args.gpus),
                "allreduce_busbw_gbps": None,
                "allreduce_backend": None,
                "peak_memory_mib": [None] * len(args.gpus),
            },
            "checks": [],
            "summary": {},
        }

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def tool_timeout(self) -> float:
        return min(60.0, self.remaining() - 0.5)

    def record(self, name: str, status: str, reason: str, duration: float) -> None:
        self.checks[name] = {"name": name, "status": status, "reason": reason, "duration_s": _round(duration)}
        log(f"{name}: {status} {reason}")

    def guarded(self, name: str, check) -> None:
        started = time.monotonic()
        try:
            status, reason = check()
        except _Stop:
            raise
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            status, reason = FAIL, f"the check itself failed: {type(exc).__name__}: {short_text(exc)}"
        self.record(name, status, reason, time.monotonic() - started)

    # -- gpu_visible ------------------------------------------------------------------------------------------

    def _query_nvidia(self) -> tuple[list[dict] | None, str]:
        ids = ",".join(str(gpu) for gpu in self.args.gpus)
        error = ""
        for fields in (NVIDIA_SMI_FIELDS, NVIDIA_SMI_FIELDS_OLD):
            # nvidia-smi ignores CUDA_VISIBLE_DEVICES: ask for the requested GPUs by index, not for the node's.
            argv = ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", ids]
            result = run_tool(argv, self.tool_timeout())
            if not result["found"]:
                amd = [tool for tool in ("rocm-smi", "amd-smi") if shutil.which(tool)]
                hint = f" ({amd[0]} is: an AMD node?)" if amd else ""
                return None, f"nvidia-smi not found on PATH{hint}"
            if result["rc"] == 0:
                return parse_nvidia_smi(result["out"]), ""
            error = short_text(result["err"] or result["out"] or f"exit status {result['rc']}")
            if result["rc"] is None:  # hung (killed) or could not run: asking again would not help
                return None, f"nvidia-smi failed: {error}"
            if "compute_cap" not in error:
                break
        # One requested index the node lacks makes `-i` fail as a whole: list the node's GPUs to say which.
        listing = run_tool(
            ["nvidia-smi", f"--query-gpu={NVIDIA_SMI_FIELDS_OLD}", "--format=csv,noheader,nounits"],
            self.tool_timeout(),
        )
        if listing["rc"] == 0:
            return parse_nvidia_smi(listing["out"]), f"nvidia-smi -i {ids} failed ({error})"
        return None, f"nvidia-smi failed: {error}"

    def _query_amd(self) -> tuple[list[dict] | None, str, str | None]:
        problems = []
        attempts = (
            ("amd-smi", ["amd-smi", "static", "--asic", "--vram", "--driver", "--json"], parse_amd_smi),
            (
                "rocm-smi",
                [
                    "rocm-smi",
                    "--showproductname",
                    "--showmeminfo",
                    "vram",
                    "--showdriverversion",
                    "--showuniqueid",
                    "--json",
                ],
                parse_rocm_smi,
            ),
        )
        for tool, argv, parser in attempts:
            result = run_tool(argv, self.tool_timeout())
            if not result["found"]:
                problems.append(f"{tool} not found on PATH")
                continue
            try:
                gpus = parser(result["out"])
            except (ValueError, TypeError, AttributeError) as exc:
                problems.append(
                    f"{tool}: unreadable output ({type(exc).__name__}: {short_text(exc, 120)}; "
                    f"exit {result['rc']}: {short_text(result['err'], 120)})"
                )
                continue
            if gpus:
                return gpus, "", tool
            problems.append(f"{tool} lists no GPU ({short_text(result['err'] or result['out'], 120)})")
        return None, "; ".join(problems), None

    def check_gpu_visible(self) -> tuple[str, str]:
        gpus = self.args.gpus
        if self.vendor == "nvidia":
            rows, problem = self._query_nvidia()
            tool = "nvidia-smi" if rows is not None else None
        else:
            rows, problem, tool = self._query_amd()
        self.tool_gpus = {row["index"]: row for row in rows or []}
        uuids = {gpu: self.tool_gpus.get(gpu, {}).get("uuid") for gpu in gpus}
        self.logical, filtering = visible_mapping(self.vendor, gpus, os.environ, uuids)
        if rows is None:
            return FAIL, f"no GPU: {problem}"
        present = [gpu for gpu in gpus if gpu in self.tool_gpus]
        visible = [gpu for gpu in present if self.logical[gpu] is not None]
        self.driver = next((row["driver"] for row in self.tool_gpus.values() if row.get("driver")), None)
        self.report["gpu"] = {
            "tool": tool,
            "count": len(visible),
            "models": [self.tool_gpus[gpu]["name"] for gpu in present],
            "driver": self.driver,
            "memory_total_mib": [self.tool_gpus.get(gpu, {}).get("memory_total_mib") for gpu in gpus],
        }
        missing = [gpu for gpu in gpus if gpu not in self.tool_gpus]
        hidden = [gpu for gpu in present if self.logical[gpu] is None]
        node = ",".join(str(index) for index in sorted(self.tool_gpus)) or "none"
        problems = []
        if missing:
            problems.append(f"GPU {','.join(map(str, missing))} not on this node ({tool} lists {node}) {problem}")
        if hidden:
            problems.append(f"GPU {','.join(map(str, hidden))} hidden by {filtering}")
        if problems:
            return FAIL, f"{len(visible)} of {len(gpus)} requested GPUs visible: " + "; ".join(problems)
        if problem:  # `-i` failed, yet the node listing has every requested GPU
            return WARN, f"{len(visible)} GPUs visible, but {problem}"
        mapping = ", ".join(f"{gpu}→cuda:{self.logical[gpu]}" for gpu in gpus)
        reason = f"{len(visible)} GPUs via {tool}: {', '.join(self.report['gpu']['models'])} ({filtering}; {mapping})"
        busy = [
            f"GPU {gpu} already uses {self.tool_gpus[gpu]['memory_used_mib']} MiB"
            for gpu in gpus
            if (self.tool_gpus[gpu].get("memory_used_mib") or 0) > BUSY_MEMORY_MIB
        ]
        if busy:
            return WARN, reason + "; another process holds memory: " + "; ".join(busy)
        return PASS, reason

    # -- driver -----------------------------------------------------------------------------------------------

    def check_driver(self) -> tuple[str, str]:
        if self.vendor == "nvidia":
            if self.driver:
                return PASS, f"NVIDIA driver {self.driver}"
            with contextlib.suppress(OSError):
                with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as handle:
                    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", handle.read())
                if match:
                    self.driver = match.group(1)
                    self.report["gpu"]["driver"] = self.driver
                    return WARN, f"NVIDIA kernel module {self.driver} (from /proc) but nvidia-smi failed"
            return FAIL, "no NVIDIA driver: no version from nvidia-smi and no /proc/driver/nvidia/version"
        if self.driver:
            return PASS, f"amdgpu driver {self.driver}"
        with contextlib.suppress(OSError):
            with open("/sys/module/amdgpu/version", encoding="utf-8") as handle:
                self.driver = handle.read().strip() or None
            if self.driver:
                self.report["gpu"]["driver"] = self.driver
                return WARN, f"amdgpu {self.driver} (/sys/module/amdgpu/version) but no GPU tool answered"
        if os.path.exists("/dev/kfd"):
            return WARN, "/dev/kfd exists (amdgpu loaded) but its version is unknown"
        return FAIL, "no AMD driver: no version from amd-smi/rocm-smi, no /sys/module/amdgpu, no /dev/kfd"

    # -- compiled_extensions ----------------------------------------------------------------------------------

    def check_compiled_extensions(self) -> tuple[str, str]:
        roots = [os.path.realpath(path) for path in self.args.site_packages or []] or site_packages_dirs()
        if not roots:
            return SKIP, "no site-packages directory found"
        budget = min(120.0, max(self.remaining() * 0.2, 1.0))
        scan = scan_extensions(roots, self.args.expect_arch, self.vendor, time.monotonic() + budget)
        self.report["results"]["extensions"] = {
            "target": self.args.expect_arch,
            "roots": roots[:8],
            "scanned": scan["scanned"],
            "stopped": scan["stopped"],
            **{
                key: [item["name"] for item in scan[key][:EXTENSION_NAMES_LISTED]]
                for key in ("missing", "fallback", "unreadable")
            },
            "native_count": len(scan["native"]),
            "missing_count": len(scan["missing"]),
            "fallback_count": len(scan["fallback"]),
        }
        return extensions_verdict(scan, self.args.expect_arch)

    # -- the worker -------------------------------------------------------------------------------------------

    def worker_config(self) -> dict:
        remaining = self.remaining()
        return {
            "gpus": list(self.args.gpus),
            "logical": [self.logical.get(gpu) for gpu in self.args.gpus],
            "vendor": self.vendor,
            "expect_arch": self.args.expect_arch,
            "matmul_size": self.args.matmul_size,
            "allreduce_mb": self.args.allreduce_mb,
            # the worker stops its own work (and its all-reduce ranks) a little before we would kill it
            "budget_s": max(remaining - min(5.0, max(1.0, 0.1 * remaining)), 0.5),
            "driver": self.driver,
            "tool_archs": [self.tool_gpus.get(gpu, {}).get("arch") for gpu in self.args.gpus],
            "tool_uuids": [self.tool_gpus.get(gpu, {}).get("uuid") for gpu in self.args.gpus],
            "tool_memory_mib": [self.tool_gpus.get(gpu, {}).get("memory_total_mib") for gpu in self.args.gpus],
        }

    def _merge(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "check" and isinstance(event.get("check"), dict) and event["check"].get("name") in WORKER_CHECKS:
            check = event["check"]
            self.record(
                check["name"],
                check.get("status") if check.get("status") in _SEVERITY else FAIL,
                str(check.get("reason", "")),
                float(check.get("duration_s") or 0),
            )
        elif kind in ("stack", "results", "gpu") and isinstance(event.get(kind), dict):
            self.report[kind].update(event[kind])

    def run_worker(self) -> None:
        read_fd, write_fd = os.pipe()
        worker_env = dict(os.environ)
        if self.vendor == "nvidia":
            worker_env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # torch numbers GPUs as nvidia-smi does
        argv = [
            sys.executable,
            *_interpreter_flags(),
            os.path.abspath(__file__),
            "--_worker",
            json.dumps(self.worker_config()),
            str(write_fd),
        ]
        running, running_since = None, time.monotonic()
        ended = ""
        try:
            self.worker = subprocess.Popen(  # noqa: S603 - this very file, no shell
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr.fileno(),  # whatever torch, NCCL or a rank prints lands in our stderr
                pass_fds=(write_fd,),
                start_new_session=True,  # the worker and its all-reduce ranks form one group: one kill
                env=worker_env,
            )
        except OSError as exc:
            os.close(read_fd)
            self._fill(None, FAIL, f"cannot start the torch worker: {exc}", 0.0)
            return
        finally:
            os.close(write_fd)
        buffer = b""
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(read_fd, selectors.EVENT_READ)
                while True:
                    remaining = self.remaining()
                    if remaining <= 0:
                        ended = f"timed out: --timeout {self.args.timeout:g} s reached during this check"
                        break
                    if not selector.select(timeout=min(remaining, 1.0)):
                        continue
                    chunk = os.read(read_fd, 65536)
                    if not chunk:
                        break
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        try:
                            event = json.loads(line)
                        except ValueError:
                            continue
                        if event.get("event") == "begin":
                            running, running_since = event.get("check"), time.monotonic()
                        else:
                            self._merge(event)
            if not ended:
                try:
                    code = self.worker.wait(timeout=max(self.remaining(), 0.1))
                except subprocess.TimeoutExpired:
                    ended = f"timed out: --timeout {self.args.timeout:g} s reached during this check"
                else:
                    if code < 0:
                        ended = f"the torch worker died of {signal.Signals(-code).name} during this check"
                    elif code != 0:
                        ended = f"the torch worker exited with status {code} during this check"
                    else:
                        ended = "the torch worker ended before this check"
        except _Stop as stop:
            ended = str(stop)
            raise
        finally:
            os.close(read_fd)
            self._kill_worker()
            self._fill(running, FAIL, ended or "not run", time.monotonic() - running_since)

    def _kill_worker(self) -> None:
        if self.worker is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(self.worker.pid, signal.SIGKILL)  # the worker, its all-reduce ranks, their helpers
        with contextlib.suppress(Exception):
            self.worker.wait(timeout=5)

    def _fill(self, running: str | None, status: str, reason: str, duration: float) -> None:
        """Checks the worker did not report: the one it was running (or the first) fails, the others are skipped."""
        missing = [name for name in WORKER_CHECKS if name not in self.checks]
        if not missing:
            return
        culprit = running if running in missing else missing[0]
        for name in missing:
            if name == culprit:
                self.record(name, status, reason, duration)
            else:
                self.record(name, SKIP, f"not run: {culprit} did not finish", 0.0)

    # -- the whole run ----------------------------------------------------------------------------------------

    def run(self) -> dict:
        def stop(signum, _frame):
            raise _Stop(f"interrupted by {signal.Signals(signum).name}")

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.guarded("gpu_visible", self.check_gpu_visible)
            self.guarded("driver", self.check_driver)
            self.guarded("compiled_extensions", self.check_compiled_extensions)
            self.run_worker()
        except _Stop as interrupted:  # the check that was running fails: an interrupted run never passes
            self._kill_worker()
            missing = [name for name in CHECKS if name not in self.checks]
            for position, name in enumerate(missing):
                self.record(name, SKIP if position else FAIL, str(interrupted), 0.0)
        finally:
            for sig, handler in previous.items():
                with contextlib.suppress(Exception):
                    signal.signal(sig, handler)
        return self.finish()

    def finish(self) -> dict:
        checks = [
            self.checks.get(name) or {"name": name, "status": SKIP, "reason": "not run", "duration_s": 0.0}
            for name in CHECKS
        ]
        counts = {status: sum(1 for check in checks if check["status"] == status) for status in _SEVERITY}
        self.report["checks"] = checks
        self.report["summary"] = {
            "status": FAIL if counts[FAIL] else PASS,
            "passed": counts[PASS],
            "failed": counts[FAIL],
            "skipped": counts[SKIP],
            "warnings": counts[WARN],
        }
        self.report["duration_s"] = _round(time.monotonic() - self.t0)
        return self.report


def _interpreter_flags() -> list[str]:
    """The worker runs under the same isolation as we do (-I, -S, -E, -s): a torch we cannot see, it cannot."""
    flags = []
    if sys.flags.isolated:
        flags.append("-I")
    else:
        if sys.flags.ignore_environment:
            flags.append("-E")
        if sys.flags.no_user_site:
            flags.append("-s")
    if sys.flags.no_site:
        flags.append("-S")
    return flags


# --------------------------------------------------------------------------------------------------------------
# Worker: everything that imports torch
# --------------------------------------------------------------------------------------------------------------


class Worker:
    def __init__(self, config: dict, channel):
        self.cfg = config
        self.channel = channel
        self.deadline = time.monotonic() + float(config["budget_s"])
        self.vendor = config["vendor"]
        self.gpus = config["gpus"]
        self.logical = config["logical"]
        self.torch = None
        self.gpu_ok = False
        self.no_gpu = "no GPU"
        self.peaks: list[float | None] = [None] * len(self.gpus)

    def emit(self, **event) -> None:
        self.channel.write(json.dumps(event) + "\n")
        self.channel.flush()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def run(self) -> None:
        for name in WORKER_CHECKS:
            self.emit(event="begin", check=name)
            started = time.monotonic()
            try:
                status, reason = getattr(self, f"check_{name}")()
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                status, reason = FAIL, f"the check itself failed: {type(exc).__name__}: {short_text(exc)}"
            duration = time.monotonic() - started
            self.emit(
                event="check", check={"name": name, "status": status, "reason": reason, "duration_s": _round(duration)}
            )

    # -- torch_import / accelerator_runtime -------------------------------------------------------------------

    def check_torch_import(self) -> tuple[str, str]:
        try:
            import torch  # the one place torch is imported: lazily, in the worker
        except BaseException as exc:  # a broken install raises anything: ImportError, OSError, SystemExit…
            if isinstance(exc, KeyboardInterrupt):
                raise
            return FAIL, f"cannot import torch: {type(exc).__name__}: {short_text(exc)} (install torch for the node)"
        self.torch = torch
        self.emit(
            event="stack",
            stack={
                "torch": getattr(torch, "__version__", "unknown"),
                "cuda": getattr(torch.version, "cuda", None),
                "hip": getattr(torch.version, "hip", None),
            },
        )
        return PASS, f"torch {torch.__version__} from {os.path.dirname(getattr(torch, '__file__', '') or '?')}"

    def check_accelerator_runtime(self) -> tuple[str, str]:
        torch = self.torch
        if torch is None:
            self.no_gpu = "no GPU: torch is not importable"
            return SKIP, "torch is not importable (see torch_import)"
        import warnings

        cuda, hip = getattr(torch.version, "cuda", None), getattr(torch.version, "hip", None)
        problems, notes = [], []
        if self.vendor == "nvidia" and not cuda:
            kind = f"a ROCm build (HIP {hip})" if hip else "a CPU-only build"
            problems.append(f"torch {torch.__version__} is {kind}: torch.version.cuda is None")
        if self.vendor == "amd" and not hip:
            kind = f"a CUDA build (CUDA {cuda})" if cuda else "a CPU-only build"
            problems.append(f"torch {torch.__version__} is {kind}: torch.version.hip is None")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            available = bool(torch.cuda.is_available())
            count = torch.cuda.device_count() if available else 0
        if not available:
            said = "; ".join(short_text(w.message, 200) for w in caught)
            problems.append("torch.cuda.is_available() is False" + (f" ({said})" if said else ""))
        driver = _version_tuple(self.cfg.get("driver"))
        cuda_version = _version_tuple(cuda)
        if self.vendor == "nvidia" and driver and cuda_version and cuda_version[0] in CUDA_MIN_DRIVER:
            needed = CUDA_MIN_DRIVER[cuda_version[0]]
            if driver < needed:
                problems.append(
                    f"CUDA {cuda} needs driver >= {'.'.join(map(str, needed))}, node has {self.cfg['driver']}"
                )
        if available:
            for gpu, index, uuid in _zip(self.gpus, self.logical, self.cfg["tool_uuids"]):
                if index is None:
                    problems.append(f"GPU {gpu} is hidden from torch by the visible-devices environment")
                elif index >= count:
                    problems.append(f"GPU {gpu} would be cuda:{index} but torch sees {count} device(s)")
                else:
                    props = torch.cuda.get_device_properties(index)
                    notes.append(f"cuda:{index}={props.name}")
                    torch_uuid = str(getattr(props, "uuid", "") or "")
                    if self.vendor == "nvidia" and uuid and torch_uuid and not _same_uuid(torch_uuid, uuid):
                        notes.append(
                            f"cuda:{index} is {torch_uuid}, nvidia-smi GPU {gpu} is {uuid}: check CUDA_DEVICE_ORDER"
                        )
        if problems:
            self.no_gpu = "no GPU: torch cannot use one (see accelerator_runtime)"
            return FAIL, "; ".join(problems)
        self.gpu_ok = True
        runtime = f"CUDA {cuda}" if cuda else f"HIP {hip}"
        status = WARN if any("check CUDA_DEVICE_ORDER" in note for note in notes) else PASS
        return status, f"{runtime}, torch sees {count} device(s): {', '.join(notes)}"

    # -- arch_supported ---------------------------------------------------------------------------------------

    def device_archs(self) -> list[str | None]:
        torch = self.torch
        archs: list[str | None] = []
        for index, tool_arch in _zip(self.logical, self.cfg["tool_archs"]):
            arch = tool_arch
            if self.gpu_ok and index is not None:
                with contextlib.suppress(Exception):
                    if self.vendor == "amd":
                        arch = torch.cuda.get_device_properties(index).gcnArchName or tool_arch
                    else:
                        arch = cuda_capability_name(torch.cuda.get_device_capability(index))
            archs.append(arch)
        return archs

    def check_arch_supported(self) -> tuple[str, str]:
        expected = self.cfg["expect_arch"]
        archs = self.device_archs() if self.torch is not None else list(self.cfg["tool_archs"])
        self.emit(event="stack", stack={"device_capabilities": archs})
        mismatched = [
            f"GPU {gpu} is {arch}" for gpu, arch in _zip(self.gpus, archs) if arch and _amd_split(arch)[0] != expected
        ]
        if self.torch is None:
            if mismatched:
                return FAIL, f"expected {expected}: {'; '.join(mismatched)} (torch not importable)"
            return SKIP, "torch is not importable (see torch_import): no arch list to check"
        arch_list = torch_arch_list(self.torch)
        self.emit(event="stack", stack={"arch_list": arch_list})
        torch_version = self.torch.version
        cpu_only = not getattr(torch_version, "cuda", None) and not getattr(torch_version, "hip", None)
        build = f"torch {self.torch.__version__}" + (" (a CPU-only build)" if cpu_only else "")
        status, reason = arch_coverage(expected, arch_list)
        reasons = [f"{build}: {reason}"]
        if mismatched:
            status = FAIL
            reasons.append(f"expected {expected} hardware: {'; '.join(mismatched)}")
        for arch in sorted({arch for arch in archs if arch and _amd_split(arch)[0] != expected}):
            device_status, device_reason = arch_coverage(arch, arch_list)
            if device_status != PASS:
                status = _worst(status, device_status)
                reasons.append(device_reason)
        if not any(archs):
            reasons.append("device arch unknown (no GPU answered)")
        return status, "; ".join(reasons)

    # -- bf16_matmul ------------------------------------------------------------------------------------------

    def matmul(self, device, size: int, target_s: float) -> dict:
        """Warm up, then time torch.matmul on bf16 size×size; also check the result against fp32 on a few rows."""
        torch = self.torch
        sync = synchronizer(torch, device)
        generator = torch.Generator(device=device).manual_seed(1234)
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=generator)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=generator)
        c = torch.matmul(a, b)
        sync()
        for _ in range(2):
            torch.matmul(a, b, out=c)
        sync()
        started = time.perf_counter()
        torch.matmul(a, b, out=c)
        sync()
        one = max(time.perf_counter() - started, 1e-6)
        budget = max(min(target_s, self.remaining() * 0.25), one)
        iterations = int(min(max(budget / one, 3), 1000))
        started = time.perf_counter()
        for _ in range(iterations):
            torch.matmul(a, b, out=c)
        sync()
        seconds = time.perf_counter() - started
        rows = min(8, size)
        reference = a[:rows].float() @ b.float()
        got = c[:rows].float()
        error = ((got - reference).abs().max() / reference.abs().max().clamp_min(1e-6)).item()
        finite = bool(torch.isfinite(c).all().item())
        del a, b, c, reference, got
        return {
            "tflops": 2 * size**3 * iterations / seconds / 1e12,
            "iterations": iterations,
            "seconds": seconds,
            "rel_error": error,
            "finite": finite,
        }

    def check_bf16_matmul(self) -> tuple[str, str]:
        torch = self.torch
        if torch is None:
            return SKIP, "torch is not importable (see torch_import)"
        size = self.cfg["matmul_size"]
        if not self.gpu_ok:
            cpu_size = min(size, 512)
            figure = ""
            try:
                cpu = self.matmul(torch.device("cpu"), cpu_size, target_s=0.5)
                self.emit(
                    event="results",
                    results={"cpu_bf16_matmul_tflops": _round(cpu["tflops"], 4), "cpu_bf16_matmul_size": cpu_size},
                )
                figure = f"; for diagnosis, a CPU bf16 {cpu_size}×{cpu_size} matmul ran at {cpu['tflops']:.4f} TFLOP/s"
            except Exception as exc:
                figure = f"; the CPU bf16 matmul failed too: {type(exc).__name__}: {short_text(exc, 120)}"
            return FAIL, f"{self.no_gpu}{figure}"
        figures: list[float | None] = []
        problems, notes = [], []
        for gpu, index in _zip(self.gpus, self.logical):
            if self.remaining() <= 0:
                figures.append(None)
                problems.append(f"GPU {gpu}: out of time")
                continue
            device = torch.device("cuda", index)
            try:
                torch.cuda.reset_peak_memory_stats(device)
                run = self.matmul(device, size, target_s=1.0)
                self.peaks[self.gpus.index(gpu)] = torch.cuda.max_memory_allocated(device) / 2**20
                torch.cuda.empty_cache()
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                figures.append(None)
                problems.append(f"GPU {gpu}: {type(exc).__name__}: {short_text(exc, 200)}")
                continue
            figures.append(_round(run["tflops"], 1))
            seconds = run["seconds"]
            notes.append(f"GPU {gpu} {run['tflops']:.1f} TFLOP/s ({run['iterations']} × {size}³ in {seconds:.2f} s)")
            if not run["finite"] or run["rel_error"] > MATMUL_TOLERANCE:
                problems.append(
                    f"GPU {gpu} computes wrong results (non-finite: {not run['finite']}, "
                    f"max error {run['rel_error']:.3g} vs fp32 > {MATMUL_TOLERANCE})"
                )
        self.emit(event="results", results={"bf16_matmul_tflops": figures})
        if problems:
            return FAIL, "; ".join(problems + notes)
        warnings_ = []
        floor = MATMUL_FLOOR_TFLOPS.get(self.cfg["expect_arch"])
        measured = [value for value in figures if value is not None]
        if floor and size >= MATMUL_FLOOR_MIN_SIZE:
            warnings_ += [
                f"GPU {gpu} below {floor:g} TFLOP/s"
                for gpu, value in _zip(self.gpus, figures)
                if value is not None and value < floor
            ]
        if len(measured) > 1 and min(measured) < 0.8 * max(measured):
            warnings_.append("GPUs differ by more than 20%: throttling or clocks?")
        if warnings_:
            return WARN, "; ".join(warnings_ + notes)
        return PASS, "; ".join(notes)

    # -- sdpa_attention ---------------------------------------------------------------------------------------

    def devices_to_test(self) -> list[tuple[str, object, int | None]]:
        """(label, torch device, position) for each requested GPU torch can use, or the CPU (for diagnosis)."""
        torch = self.torch
        if not self.gpu_ok:
            return [("CPU", torch.device("cpu"), None)]
        return [
            (f"GPU {gpu}", torch.device("cuda", index), position)
            for position, (gpu, index) in enumerate(_zip(self.gpus, self.logical))
        ]

    def sdpa_compare(self, device, dtype, *, causal: bool) -> dict:
        """scaled_dot_product_attention forward and backward against the explicit math, computed in fp32 from the
        same inputs: the largest error relative to the reference's magnitude, for the output and each gradient."""
        torch = self.torch
        generator = torch.Generator(device=device).manual_seed(4321)
        batch, heads, length, dim = 2, 4, 128, 64
        shape = (batch, heads, length, dim)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=generator) for _ in range(3))
        upstream = torch.randn(shape, device=device, dtype=dtype, generator=generator)
        inputs = [tensor.clone().requires_grad_(True) for tensor in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*inputs, is_causal=causal)
        out.backward(upstream)
        reference_inputs = [tensor.float().clone().requires_grad_(True) for tensor in (q, k, v)]
        rq, rk, rv = reference_inputs
        scores = rq @ rk.transpose(-2, -1) / math.sqrt(dim)
        if causal:
            mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        reference = torch.softmax(scores, dim=-1) @ rv
        reference.backward(upstream.float())

        def error(got, want) -> float:
            if not bool(torch.isfinite(got).all().item()):
                return float("inf")
            return ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()

        errors = {"out": error(out.detach(), reference.detach())}
        for name, tensor, ref in zip(("dq", "dk", "dv"), inputs, reference_inputs):  # noqa: B905 - three each
            errors[name] = float("inf") if tensor.grad is None else error(tensor.grad, ref.grad)
        return errors

    def check_sdpa_attention(self) -> tuple[str, str]:
        torch = self.torch
        if torch is None:
            return SKIP, "torch is not importable (see torch_import)"
        if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
            return FAIL, f"torch {torch.__version__} has no torch.nn.functional.scaled_dot_product_attention"
        dtypes = ["float32"] if not self.gpu_ok else ["bfloat16", "float16", "float32"]
        problems, notes, worst = [], [], {}
        for label, device, position in self.devices_to_test():
            if self.remaining() <= 0:
                problems.append(f"{label}: out of time")
                continue
            for dtype_name in dtypes:
                for causal in (False, True):
                    variant = f"{label} {dtype_name}{' causal' if causal else ''}"
                    try:
                        errors = self.sdpa_compare(device, getattr(torch, dtype_name), causal=causal)
                    except Exception as exc:
                        traceback.print_exc(file=sys.stderr)
                        problems.append(f"{variant}: {type(exc).__name__}: {short_text(exc, 200)}")
                        continue
                    tolerance = SDPA_TOLERANCE[dtype_name]
                    largest = max(errors.values())
                    worst[dtype_name] = max(worst.get(dtype_name, 0.0), largest)
                    wrong = [f"{name} {value:.3g}" for name, value in errors.items() if not value <= tolerance]
                    if wrong:
                        wrong_list = ", ".join(wrong)
                        problems.append(f"{variant}: differs from the math reference ({wrong_list} > {tolerance:g})")
            if position is not None:
                with contextlib.suppress(Exception):
                    peak = torch.cuda.max_memory_allocated(device) / 2**20
                    self.peaks[position] = max(self.peaks[position] or 0.0, peak)
        self.emit(event="results", results={"sdpa_max_rel_error": {k: float(f"{v:.3g}") for k, v in worst.items()}})
        notes.append(
            "forward and backward (dq, dk, dv) match softmax(QK^T/sqrt(d))V, largest relative error "
            + ", ".join(f"{name} {value:.2g}" for name, value in worst.items())
        )
        if problems:
            return FAIL, "; ".join(problems)
        if not self.gpu_ok:
            return WARN, f"CPU only: {self.no_gpu}; on the CPU, {notes[0]}"
        return PASS, notes[0]

    # -- checkpoint_roundtrip ---------------------------------------------------------------------------------

    def checkpoint_roundtrip(self, device, directory: str) -> dict:
        """Train a small model two steps, save model + optimizer, load both into fresh objects: the reloaded model
        answers exactly the same, and one more step from either copy gives exactly the same parameters."""
        torch = self.torch
        torch.manual_seed(99)

        def fresh():
            model = torch.nn.Sequential(
                torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512), torch.nn.Linear(512, 64)
            ).to(device)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

        model, optimizer = fresh()
        batch = torch.randn(32, 256, device=device)
        for _ in range(2):
            optimizer.zero_grad()
            model(batch).square().mean().backward()
            optimizer.step()
        path = os.path.join(directory, "checkpoint.pt")
        started = time.perf_counter()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        size = os.path.getsize(path)
        state = torch.load(path, map_location=device, weights_only=True)
        seconds = time.perf_counter() - started
        copy, copy_optimizer = fresh()
        copy.load_state_dict(state["model"])
        copy_optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            same_output = bool(torch.equal(model(batch), copy(batch)))
        for net, opt in ((model, optimizer), (copy, copy_optimizer)):
            opt.zero_grad()
            net(batch).square().mean().backward()
            opt.step()
        same_step = all(torch.equal(a, b) for a, b in zip(model.parameters(), copy.parameters()))  # noqa: B905
        return {"bytes": size, "seconds": seconds, "same_output": same_output, "same_step": same_step}

    def check_checkpoint_roundtrip(self) -> tuple[str, str]:
        import tempfile

        if self.torch is None:
            return SKIP, "torch is not importable (see torch_import)"
        home = os.path.expanduser("~")
        parent = home if os.path.isdir(home) and os.access(home, os.W_OK) else None  # the user's space, else /tmp
        problems, notes = [], []
        with tempfile.TemporaryDirectory(prefix=".binome-preflight-", dir=parent) as directory:
            for label, device, _position in self.devices_to_test():
                try:
                    run = self.checkpoint_roundtrip(device, directory)
                except Exception as exc:
                    traceback.print_exc(file=sys.stderr)
                    problems.append(f"{label}: {type(exc).__name__}: {short_text(exc, 200)}")
                    continue
                if not run["same_output"]:
                    problems.append(f"{label}: the reloaded model answers differently")
                if not run["same_step"]:
                    problems.append(f"{label}: the reloaded optimizer takes a different step")
                notes.append(f"{label} {run['bytes'] / 2**20:.1f} MiB saved and reloaded in {run['seconds']:.2f} s")
                self.emit(event="results", results={"checkpoint_bytes": run["bytes"]})
        where = f"in {parent or tempfile.gettempdir()}"
        if problems:
            return FAIL, "; ".join(problems) + f" ({where})"
        detail = f"model + AdamW state {where}: " + "; ".join(notes) + ", outputs and next step identical"
        if not self.gpu_ok:
            return WARN, f"CPU only: {self.no_gpu}; {detail}"
        return PASS, detail

    # -- allreduce --------------------------------------------------------------------------------------------

    def check_allreduce(self) -> tuple[str, str]:
        torch = self.torch
        if torch is None:
            return SKIP, "torch is not importable (see torch_import)"
        world = len(self.gpus)
        if world < 2:
            return SKIP, "one GPU requested: nothing to all-reduce between"
        try:
            import torch.distributed as dist
            import torch.multiprocessing as torch_mp
        except Exception as exc:
            return FAIL, f"torch.distributed unavailable: {type(exc).__name__}: {short_text(exc)}"
        if not dist.is_available():
            return FAIL, "torch.distributed is not available in this torch build"
        if self.gpu_ok:
            if not dist.is_nccl_available():
                return FAIL, f"{'RCCL' if self.vendor == 'amd' else 'NCCL'} is not available in this torch build"
            backend, label, device_type = "nccl", ("rccl" if self.vendor == "amd" else "nccl"), "cuda"
        else:
            if not dist.is_gloo_available():
                return FAIL, f"{self.no_gpu}; gloo is not available either"
            backend, label, device_type = "gloo", "gloo", "cpu"
        nbytes = self.cfg["allreduce_mb"] * 2**20
        budget = self.remaining() - 1.0  # room to kill the ranks and run peak_memory
        if budget < 2:
            return FAIL, f"timed out: {budget:.1f} s left of --timeout for the all-reduce"
        job = {
            "backend": backend,
            "device_type": device_type,
            "devices": list(self.logical),
            "nbytes": nbytes,
            "warmup": 5 if device_type == "cuda" else 1,
            "iterations": 20 if device_type == "cuda" else 5,
            "timeout_s": max(budget, 1.0),
        }
        log(f"all-reduce: {world} ranks, {backend}, {self.cfg['allreduce_mb']} MiB, {budget:.0f} s budget")
        deadline = time.monotonic() + budget
        ranks, timed_out, error = run_ranks(torch_mp, _allreduce_rank, job, world=world, deadline=deadline, grace_s=5.0)
        failure = None
        if timed_out:
            failure = f"timed out after {budget:.0f} s: all-reduce ranks killed"
        elif error is not None:
            failure = f"a rank failed: {type(error).__name__}: {short_text(error, 300)}"
        self.emit(event="results", results={"allreduce_backend": label})
        errors = [f"rank {r.get('rank')}: {r['error']}" for r in ranks if r.get("error")]
        if failure or errors or len(ranks) != world:
            return FAIL, "; ".join([failure or f"{len(ranks)} of {world} ranks reported", *errors])
        for rank in ranks:
            if rank.get("peak_mib") is not None and rank.get("device") is not None:
                position = self.logical.index(rank["device"])
                self.peaks[position] = max(self.peaks[position] or 0.0, rank["peak_mib"])
        lead = ranks[0]
        busbw = lead["busbw_gbps"]
        self.emit(
            event="results",
            results={"allreduce_busbw_gbps": _round(busbw, 2), "allreduce_algbw_gbps": _round(lead["algbw_gbps"], 2)},
        )
        detail = (
            f"{label} all-reduce of {self.cfg['allreduce_mb']} MiB fp32 over {world} ranks: "
            f"busbw {busbw:.2f} GB/s (algbw {lead['algbw_gbps']:.2f} GB/s, {lead['iterations']} iterations, "
            f"{lead['seconds'] / lead['iterations'] * 1e3:.2f} ms each)"
        )
        if not all(rank.get("correct") for rank in ranks):
            return FAIL, f"wrong all-reduce result on some rank; {detail}"
        if busbw <= 0:
            return FAIL, f"no bandwidth measured; {detail}"
        if not self.gpu_ok:
            return WARN, f"CPU gloo only: no GPU; {detail}"
        floor = ALLREDUCE_FLOOR_GBPS.get(self.cfg["expect_arch"])
        if floor and self.cfg["allreduce_mb"] >= ALLREDUCE_FLOOR_MIN_MB and busbw < floor:
            return WARN, f"busbw under {floor:g} GB/s: no NVLink/xGMI peer-to-peer?; {detail}"
        return PASS, detail

    # -- peak_memory ------------------------------------------------------------------------------------------

    def check_peak_memory(self) -> tuple[str, str]:
        if self.torch is None:
            return SKIP, "torch is not importable (see torch_import)"
        if not self.gpu_ok:
            return SKIP, f"{self.no_gpu}: nothing was allocated on a GPU"
        peaks = []
        for position, index in enumerate(self.logical):
            peak = self.peaks[position]
            with contextlib.suppress(Exception):
                peak = max(peak or 0.0, self.torch.cuda.max_memory_allocated(index) / 2**20)
            peaks.append(_round(peak, 1))
        self.emit(event="results", results={"peak_memory_mib": peaks})
        totals = self.cfg.get("tool_memory_mib") or [None] * len(peaks)
        parts = [
            f"GPU {gpu} {peak:.0f} MiB" + (f" of {total} MiB" if total else "")
            for gpu, peak, total in _zip(self.gpus, peaks, totals)
            if peak is not None
        ]
        if len(parts) != len(peaks):
            return WARN, "no peak for some GPU: " + "; ".join(parts)
        return PASS, "torch.cuda.max_memory_allocated: " + "; ".join(parts)


def _allreduce_rank(rank: int, job: dict) -> None:
    """One all-reduce rank (a torch.multiprocessing spawn child): writes rank<N>.json, raises on failure."""
    with rank_result(job, rank, error_limit=300) as result:
        import torch
        import torch.distributed as dist

        world = job["world"]
        if job["device_type"] == "cuda":
            index = job["devices"][rank]
            torch.cuda.set_device(index)
            device = torch.device("cuda", index)
            result["device"] = index
        else:
            device = torch.device("cpu")
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # ranks are on this host: no hostname lookups
        sync = synchronizer(torch, device)
        join_process_group(dist, job, rank, device, timeout_s=job["timeout_s"])
        probe = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(probe)
        sync()
        correct = bool((probe == world * (world + 1) / 2).all().item())
        tensor = torch.zeros(max(job["nbytes"] // 4, 1), dtype=torch.float32, device=device)
        for _ in range(job["warmup"]):
            dist.all_reduce(tensor)
        sync()
        dist.all_reduce(probe)  # a barrier that works for every backend
        sync()
        started = time.perf_counter()
        for _ in range(job["iterations"]):
            dist.all_reduce(tensor)
        sync()
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        seconds = float(elapsed.item())
        nbytes = tensor.numel() * tensor.element_size()
        algbw = nbytes * job["iterations"] / seconds / 1e9
        result.update(
            correct=correct,
            seconds=seconds,
            iterations=job["iterations"],
            algbw_gbps=algbw,
            busbw_gbps=algbw * 2 * (world - 1) / world,
            peak_mib=(torch.cuda.max_memory_allocated(device) / 2**20) if device.type == "cuda" else None,
        )
        dist.destroy_process_group()


def _worker_main(argv: list[str]) -> int:
    config, fd = json.loads(argv[0]), int(argv[1])
    channel = os.fdopen(fd, "w", encoding="utf-8")
    try:
        Worker(config, channel).run()
    finally:
        with contextlib.suppress(Exception):
            channel.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_worker"]:
        return _worker_main(argv[1:])
    args = parse_args(argv)  # exits 2 with a message on stderr
    supervisor = None
    try:
        supervisor = Supervisor(args)
        report = supervisor.run()
    except Exception as exc:  # a bug of ours: still one valid report, the failure named in it
        traceback.print_exc(file=sys.stderr)
        report = _emergency_report(args, supervisor, exc)
    sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
    sys.stdout.flush()
    return 1 if report["summary"]["status"] == FAIL else 0


def _emergency_report(args: argparse.Namespace, supervisor: Supervisor | None, exc: BaseException) -> dict:
    reason = f"preflight internal error: {type(exc).__name__}: {short_text(exc)}"
    if supervisor is not None:
        with contextlib.suppress(Exception):
            supervisor._kill_worker()
            for name in CHECKS:
                if name not in supervisor.checks:
                    supervisor.record(name, FAIL, reason, 0.0)
                    reason = "not run: internal error"
            return supervisor.finish()
    checks = [
        {"name": name, "status": FAIL if i == 0 else SKIP, "reason": reason if i == 0 else "not run", "duration_s": 0.0}
        for i, name in enumerate(CHECKS)
    ]
    return {
        "schema": SCHEMA,
        "started_at": now_utc(),
        "duration_s": None,
        "hostname": platform.node(),
        "python": platform.python_version(),
        "requested": {"gpus": list(args.gpus), "expect_arch": args.expect_arch, "expect_vendor": args.expect_vendor},
        "environment": {key: os.environ.get(key) for key in ENV_KEYS},
        "gpu": {"tool": None, "count": 0, "models": [], "driver": None, "memory_total_mib": []},
        "stack": {"torch": None, "cuda": None, "hip": None, "arch_list": [], "device_capabilities": []},
        "results": {
            "bf16_matmul_tflops": [],
            "allreduce_busbw_gbps": None,
            "allreduce_backend": None,
            "peak_memory_mib": [],
        },
        "checks": checks,
        "summary": {"status": FAIL, "passed": 0, "failed": 1, "skipped": len(CHECKS) - 1, "warnings": 0},
    }


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit:
        raise
    except BaseException:  # last resort: the report could not be built; say why, exit as a failed check
        traceback.print_exc(file=sys.stderr)
        code = 1
    sys.exit(code)
