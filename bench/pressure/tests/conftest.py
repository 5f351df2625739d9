"""Tests of the pressure benchmark harness. They run without servers, except the integration
tests in test_servers.py, which start real fluxkv / memcached / Redis processes themselves (and
skip when a binary is missing)."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2]
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
