"""Which device code runs on which GPU: torch's arch list against the node's architecture (CUDA compute capabilities,
PTX JIT, AMD generic code objects), and the device code of the image's compiled extensions, read from their ELF
sections without loading them. Pure functions, unit-tested on their own.

Standard library only: nodekit/bundle.py inlines this module in the shipped preflight.py, which a node runs alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import sys
import time

from nodekit.common import short_text
from nodekit.verdicts import FAIL, PASS, SKIP, WARN

# AMD generic code objects (code object v6): which processors each one runs on.
AMD_GENERIC_TARGETS = {
    "gfx9-generic": {"gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"},
    "gfx9-4-generic": {"gfx940", "gfx941", "gfx942", "gfx950"},
    "gfx10-1-generic": {"gfx1010", "gfx1011", "gfx1012", "gfx1013"},
    "gfx10-3-generic": {"gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036"},
    "gfx11-generic": {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"},
    "gfx12-generic": {"gfx1200", "gfx1201"},
}


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
