"""tracebench: real LLM request traces replayed through fluxkv.kv (and peer caches) beside
offline simulations of LRU, S3-FIFO, Belady and the infinite cache on the same requests.

    PYTHONPATH=bench /usr/bin/python3 -m tracebench --preset quick --out out/bench-trace

Modules: ``trace`` (the file format), ``sim`` (policies), ``pages`` (verifiable page bytes),
``clients`` and ``worker`` (one replay process), ``replay`` (the processes of one replay),
``backends`` (servers, via the pressure harness), ``presets``, ``report`` (rows, table),
``chart`` (trace.png), ``cli``. See bench/traces/README.md for the trace that ships here.
"""

import sys
from pathlib import Path

# The fluxkv client of this checkout, as the other benchmarks under bench/ use it.
_CLIENT = str(Path(__file__).resolve().parents[2] / "clients" / "python")
if _CLIENT not in sys.path:
    sys.path.insert(0, _CLIENT)
