"""Stand-in of ``lmcache.v1.storage_backend``: how LMCache turns ``remote_storage_plugins``
into remote connectors. For each plugin name it builds a remote backend whose connector is
created from the virtual URL ``plugin://<name>`` (the adapter reads its real settings from
``extra_config``); a legacy ``remote_url`` is handed to the adapters as it is. Release 0.3
builds no ``plugin://`` backends: a plugin is reached through ``remote_url`` only."""

from __future__ import annotations

from lmcache import RELEASE
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector import CreateConnector
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend


def CreateRemoteConnectors(
    config: LMCacheEngineConfig, metadata: LMCacheMetadata, loop, local_cpu_backend: LocalCPUBackend
) -> dict[str, RemoteConnector]:
    """The connector of every remote backend the config asks for, by backend name."""
    out: dict[str, RemoteConnector] = {}
    for name in (config.remote_storage_plugins or ()) if RELEASE == "0.4" else ():
        out[f"RemoteBackend-{name}"] = CreateConnector(
            f"plugin://{name}", loop, local_cpu_backend, config, metadata, plugin_name=name
        )
    if config.remote_url is not None:
        out["RemoteBackend"] = CreateConnector(config.remote_url, loop, local_cpu_backend, config, metadata)
    return out
