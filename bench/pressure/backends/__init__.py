"""Backends of the pressure benchmark, one module each (see ``base.py`` for the interface).

Modules are imported lazily by name, so a backend whose client library is missing on this
machine does not stop the others: its cases are reported unavailable with the reason.

A backend kept outside this package (an experiment, the test suite's fake) plugs in through
``PRESSURE_EXTRA_BACKENDS="name=dotted.module[,name2=module2]"``; the module must be importable
by the worker processes too (they inherit the environment and ``--pythonpath``).
"""

from __future__ import annotations

import importlib
import os

# The order here is the order of bars in the chart.
NAMES = ("fluxkv", "memcached", "redis", "mooncake")


def extra() -> dict[str, str]:
    out = {}
    for item in os.environ.get("PRESSURE_EXTRA_BACKENDS", "").split(","):
        if "=" in item:
            name, mod = item.split("=", 1)
            out[name.strip()] = mod.strip()
    return out


def names() -> tuple[str, ...]:
    return NAMES + tuple(n for n in extra() if n not in NAMES)


def load(name: str):
    """The backend module ``name`` (with ``Server`` and ``WorkerSide``)."""
    ext = extra()
    if name in ext:
        return importlib.import_module(ext[name])
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}: want one of {', '.join(names())}")
    return importlib.import_module(f"{__name__}.{name}")
