"""Inference-engine backends over :mod:`fluxkv.kv`: each one adapts an engine's KV-cache
storage interface to one :class:`fluxkv.kv.PageStore` and keeps no behaviour of its own.

- :mod:`fluxkv.integrations.sglang`: an SGLang HiCache storage backend
  (``--hicache-storage-backend dynamic``).
- :mod:`fluxkv.integrations.lmcache`: an LMCache remote connector (``remote_storage_plugins``).

A backend module imports its engine's base classes when the engine is installed and a small
local stand-in of them otherwise, so it loads (and its tests run) without the engine.
"""
