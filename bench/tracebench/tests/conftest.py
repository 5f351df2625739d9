"""bench/ on sys.path (for tracebench and the pressure harness it reuses), and the fluxkv binary."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2]
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


@pytest.fixture(scope="session")
def fluxkv_bin() -> str:
    """FLUXKV_BIN, else bin/fluxkv of this checkout (`make build`)."""
    path = os.environ.get("FLUXKV_BIN") or str(BENCH.parent / "bin" / "fluxkv")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no fluxkv binary at {path}: run `make build` or set FLUXKV_BIN")
    return path
