"""The GPU figures the hosts' tools print (nvidia-smi's CSV, rocm-smi's JSON), read as hostile input: bounded, parsed
field by field, a figure out of its range or garbage is no figure (None) rather than a wrong one. Pure: the readings
sampler (provisioning/readings.py), the health check and every reader of stored readings use it."""

from __future__ import annotations

import json
import math

MAX_GPUS = 16
MAX_OUTPUT = 64 * 1024
Sample = list  # [index, utilisation %, memory used MiB, memory total MiB, power W, temperature °C]
FIELDS = 6  # readings stored before temperature was read have 5: `sample_figures` reads both
HOTTEST = 150  # °C: a card reports less (it shuts down near 100); more is garbage
# What the parsers let through, per figure after the index (utilisation, used, total, power, temperature): a stored
# figure outside it is read as none, as the parsers would have made it.
LIMITS = (101, 1e7, 1e7, 100_000, HOTTEST)


def _number(text: object, *, scale: float = 1.0, limit: float = 1e7) -> float | None:
    """A finite, non-negative figure below `limit`, or None ("[N/A]", "[Not Supported]", garbage)."""
    try:
        value = float(str(text).strip()) * scale
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0 or value >= limit:
        return None
    return round(value, 1)


def sample_figures(gpu: object) -> Sample | None:
    """A stored sample as [index, utilisation, used, total, power, temperature] (None where there was no figure), or
    None when it is not one: what is stored came through the parsers, and is read as if it had not."""
    if not (isinstance(gpu, list) and len(gpu) in (FIELDS - 1, FIELDS)):
        return None
    index, *figures = gpu
    if not (type(index) is int and 0 <= index < MAX_GPUS):  # a JSON true is no index
        return None
    figures = [
        value if type(value) in (int, float) and math.isfinite(value) and 0 <= value < limit else None
        for value, limit in zip(figures, LIMITS, strict=False)
    ]
    return [index, *figures, *[None] * (FIELDS - 1 - len(figures))]


def parse_nvidia(text: str) -> dict[int, Sample]:
    """nvidia-smi's CSV (index, utilization.gpu, memory.used, memory.total, power.draw, temperature.gpu; no header,
    no units)."""
    samples = {}
    for line in text[:MAX_OUTPUT].splitlines()[: MAX_GPUS * 2]:
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != FIELDS or not fields[0].isdigit() or int(fields[0]) >= MAX_GPUS:
            continue
        index = int(fields[0])
        samples[index] = [
            index,
            _number(fields[1], limit=101),
            _number(fields[2]),
            _number(fields[3]),
            _number(fields[4], limit=100_000),
            _number(fields[5], limit=HOTTEST),
        ]
    return samples


def parse_rocm(text: str) -> dict[int, Sample]:
    """rocm-smi's JSON: {"card0": {"GPU use (%)": "12", "VRAM Total Memory (B)": "...", "VRAM Total Used Memory
    (B)": "...", "Average Graphics Package Power (W)": "...", "Temperature (Sensor edge) (C)": "..."}, ...}: the edge
    sensor (what nvidia-smi's temperature.gpu reads), else the junction's."""
    try:
        answer = json.loads(text[:MAX_OUTPUT])
    except ValueError:
        return {}
    if not isinstance(answer, dict):
        return {}
    samples = {}
    for card, values in list(answer.items())[: MAX_GPUS * 2]:
        if not (isinstance(card, str) and card.startswith("card") and card[4:].isdigit() and isinstance(values, dict)):
            continue
        index = int(card[4:])
        if index >= MAX_GPUS:
            continue
        power = next((value for key, value in values.items() if isinstance(key, str) and "Power (W)" in key), None)
        temperature = values.get("Temperature (Sensor edge) (C)", values.get("Temperature (Sensor junction) (C)"))
        mib = 1 / (1024 * 1024)
        samples[index] = [
            index,
            _number(values.get("GPU use (%)"), limit=101),
            _number(values.get("VRAM Total Used Memory (B)"), scale=mib),
            _number(values.get("VRAM Total Memory (B)"), scale=mib),
            _number(power, limit=100_000),
            _number(temperature, limit=HOTTEST),
        ]
    return samples
