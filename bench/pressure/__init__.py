"""fluxkv's pressure benchmark (docs/architecture.md §8): fluxkv, memcached and Redis under
the same Zipf workload, DRAM and flash sizes, in one run on one machine. See bench/README.md.

Modules: ``cli`` (flags, presets), ``matrix`` (cases), ``harness`` (one case end to end),
``worker`` (a benchmark process), ``workload`` (keys, values, Zipf, bootstrap order and pacing),
``stats`` (histograms, source attribution), ``cuda`` (the pinned H2D pipeline), ``chart``,
``procs`` (child processes and cleanup), ``backends/`` (one module per system).
"""
