"""Test stand-in of LMCache: only the remote-storage plugin interface fluxkv's connector meets
(see ../README.md). Not LMCache.

``RELEASE`` picks which of LMCache's remote-connector interfaces the stand-in follows, from
``LMCACHE_STANDIN_RELEASE`` when the package is imported:

- ``"0.4"`` (default; the 0.4.4+ series): ``RemoteConnector.__init__(config, metadata)`` sets
  ``meta_fmt``; ``batched_contains(keys) -> int``; every name in ``remote_storage_plugins``
  gets a remote backend of its own at ``plugin://<name>``; KV groups (multi-group models).
- ``"0.3"`` (the releases between plugin loading, LMCache PR #2225, and PR #2314): no
  ``RemoteConnector.__init__`` (``object.__init__``), ``meta_fmt`` a class attribute that
  ``init_chunk_meta`` sets only without saved chunk metadata;
  ``batched_contains(keys, stop_after_first_not_exits=True) -> List[bool]``; plugin adapters
  are found for ``remote_url`` only, no ``plugin://`` backends; one KV group.
"""

import os

RELEASE = os.environ.get("LMCACHE_STANDIN_RELEASE", "0.4")
if RELEASE not in ("0.3", "0.4"):
    raise ImportError(f"LMCACHE_STANDIN_RELEASE={RELEASE!r}: the stand-in follows '0.3' or '0.4'")
