"""Stand-in of sglang.srt.mem_cache.storage.backend_factory: only the ``dynamic`` backend,
loaded as documented -- extra_config names backend_name, module_path and class_name; the
module is imported, the class must subclass HiCacheStorage, and it is built as
``cls(storage_config, kwargs)``. The host pool is registered afterwards by the controller."""

from __future__ import annotations

import importlib

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig


class StorageBackendFactory:
    @classmethod
    def create_backend(cls, backend_name: str, storage_config: HiCacheStorageConfig, mem_pool_host, **kwargs) -> HiCacheStorage:
        if backend_name != "dynamic" or storage_config.extra_config is None:
            raise ValueError(f"unknown storage backend {backend_name!r} (the stand-in builds only 'dynamic' ones, from extra_config)")
        config = storage_config.extra_config
        for name in ("backend_name", "module_path", "class_name"):
            if name not in config:
                raise ValueError(f"the 'dynamic' backend's extra_config lacks {name!r}")
        module = importlib.import_module(config["module_path"])
        backend_class = getattr(module, config["class_name"])
        if not issubclass(backend_class, HiCacheStorage):
            raise TypeError(f"backend class {config['class_name']} must inherit from HiCacheStorage")
        return backend_class(storage_config, kwargs)
