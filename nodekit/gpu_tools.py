"""The node's GPU tools (nvidia-smi, amd-smi, rocm-smi), run without ever hanging the pre-flight check, their output
parsed as hostile text, and the visible-devices filtering (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES,
HIP_VISIBLE_DEVICES) mapped to physical indices. Pure functions beside `run_tool`, unit-tested on their own.

Standard library only: nodekit/bundle.py inlines this module in the shipped preflight.py, which a node runs alone.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess


def _is_index(text: str) -> bool:
    """ASCII digits only: `str.isdigit()` also accepts "²", which `int()` refuses."""
    return text.isascii() and text.isdigit()


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
