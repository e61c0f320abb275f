"""Compiled extensions as the pre-flight check and archcheck read them: real shared objects built with gcc, their
device-code sections laid out as nvcc and clang lay them out, and a constructor that leaves a marker if the file is
ever loaded (neither reader may load one)."""

import struct
import subprocess
from pathlib import Path


def fatbin(*entries: tuple) -> bytes:
    """An .nv_fatbin blob: ('sm', 90) is a cubin entry, ('sm', 90, 'a') an arch-specific one, ('compute', 90) PTX.
    Flags as nvcc 13 writes them (0x8011, plus 1 << 20 for sm_XYa), read from torch's libtorch_cuda.so."""
    body = b""
    for kind, arch, *suffix in entries:
        flags = 0x8011 | (1 << 20 if suffix == ["a"] else 0)
        payload = f"{kind}_{arch} code".encode().ljust(48, b"\0")
        header = struct.pack("<HHIQ", 2 if kind == "sm" else 1, 0x0101, 64, len(payload)).ljust(28, b"\0")
        header = (header + struct.pack("<I", arch)).ljust(40, b"\0") + struct.pack("<Q", flags)
        body += header.ljust(64, b"\0") + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def offload_bundle(*targets: str) -> bytes:
    names = ["host-x86_64-unknown-linux-gnu-", *(f"hipv4-amdgcn-amd-amdhsa--{target}" for target in targets)]
    table = b"".join(struct.pack("<QQQ", 0, 0, len(name)) + name.encode() for name in names)
    return b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(names)) + table


def build_extension(directory: Path, name: str, section: str, blob: bytes, marker: Path) -> Path:
    """A real shared object carrying `blob` in `section`, whose constructor would write `marker` if it ran."""
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"{name}.c"
    data = ", ".join(str(byte) for byte in blob)
    source.write_text(
        "#include <stdio.h>\n"
        f'__attribute__((used, section("{section}"))) static const unsigned char device_code[] = {{{data}}};\n'
        "__attribute__((constructor)) static void loaded(void) {"
        f' FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
        "int answer(void) { return 42; }\n"
    )
    library = directory / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True, capture_output=True)
    source.unlink()
    return library
