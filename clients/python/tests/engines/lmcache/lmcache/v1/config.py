"""Stand-in of ``lmcache.v1.config``: the engine configuration, with the fields the remote
storage plugins read, loaded from LMCache's YAML file format."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

import yaml


@dataclass
class LMCacheEngineConfig:
    chunk_size: int = 256
    local_cpu: bool = True
    max_local_cpu_size: float = 5.0
    remote_url: Optional[str] = None
    remote_serde: Optional[str] = "naive"
    remote_storage_plugins: Optional[list] = None
    use_layerwise: bool = False
    enable_blending: bool = False
    extra_config: Optional[dict] = field(default=None)

    @staticmethod
    def from_file(path: str) -> "LMCacheEngineConfig":
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
        known = {f.name for f in fields(LMCacheEngineConfig)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"{path}: unknown LMCache config keys {sorted(unknown)}")
        return LMCacheEngineConfig(**raw)

    def get_extra_config_value(self, key: str, default: Any = None) -> Any:
        return (self.extra_config or {}).get(key, default)
