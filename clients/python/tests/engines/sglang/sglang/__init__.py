"""A stand-in for SGLang in fluxkv's tests, not SGLang.

It holds the few modules of SGLang's HiCache storage interface that a storage backend meets
-- ``srt.mem_cache.hicache_storage`` (config, base class), ``srt.mem_cache.storage`` (the
backend factory's ``dynamic`` loading), ``srt.mem_cache.pool_host`` (MHA and MLA host KV
pools in both layouts), ``srt.observability.metrics_collector`` (what ``get_stats()`` must
return) and ``srt.managers.cache_controller`` (how the controller drives a backend) -- written
from their documented signatures so that ``fluxkv.integrations.sglang`` is loaded and driven
as SGLang does it. Only tests/test_sglang_backend.py puts this directory on ``sys.path``.
"""
