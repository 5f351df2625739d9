"""Stand-in of sglang.srt.mem_cache.storage: the storage backend factory."""

from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

__all__ = ["StorageBackendFactory"]
