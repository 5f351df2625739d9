"""Stand-in of ``lmcache.v1.storage_backend.connector``: connector adapters and how LMCache
finds the one for a URL.

An adapter is constructed without arguments, says whether it ``can_parse(url)`` and builds
the connector with ``create_connector(context)``. The adapters of remote storage plugins
come from the config: for each name in ``remote_storage_plugins``, ``extra_config`` names the
module (``remote_storage_plugin.<name>.module_path``) and the adapter class in it
(``remote_storage_plugin.<name>.class_name``). A plugin name is ``<type>`` or
``<type>.<instance>``; the virtual URL ``plugin://<name>`` reaches the adapter of that type.
A URL (``remote_url`` or a plugin's) is looked up among these adapters only: the built-in
connectors are left out of the stand-in, and no adapter is registered any other way. With
release 0.3 the manager calls the new connector's ``init_chunk_meta`` and ``post_init``.
"""

from __future__ import annotations

import abc
import importlib
from typing import Optional

from lmcache import RELEASE
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend


def extract_plugin_type(plugin_name: str) -> str:
    """``fs`` of ``fs`` and of ``fs.primary``."""
    return plugin_name.split(".", 1)[0]


class ConnectorContext:
    """What an adapter gets to build its connector from."""

    def __init__(
        self,
        url: str,
        loop,
        local_cpu_backend: LocalCPUBackend,
        config: Optional[LMCacheEngineConfig],
        metadata: Optional[LMCacheMetadata],
        plugin_name: Optional[str] = None,
    ):
        self.url = url
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.config = config
        self.metadata = metadata
        self.plugin_name = plugin_name


class ConnectorAdapter(abc.ABC):
    def __init__(self, schema: str = ""):
        self.schema = schema

    def can_parse(self, url: str) -> bool:
        return self.schema != "" and url.startswith(self.schema)

    @abc.abstractmethod
    def create_connector(self, context: ConnectorContext) -> RemoteConnector: ...


def plugin_adapters(config: Optional[LMCacheEngineConfig]) -> list[ConnectorAdapter]:
    """An instance of the adapter class every configured remote storage plugin names."""
    adapters = []
    extra = (config.extra_config if config else None) or {}
    for name in (config.remote_storage_plugins if config else None) or ():
        module_path = extra.get(f"remote_storage_plugin.{name}.module_path")
        class_name = extra.get(f"remote_storage_plugin.{name}.class_name")
        if not module_path or not class_name:
            raise ValueError(f"remote storage plugin {name!r}: extra_config needs module_path and class_name")
        cls = getattr(importlib.import_module(module_path), class_name)
        if not (isinstance(cls, type) and issubclass(cls, ConnectorAdapter)):
            raise TypeError(f"remote storage plugin {name!r}: {module_path}.{class_name} is not a ConnectorAdapter")
        adapters.append(cls())
    return adapters


def CreateConnector(
    url: str,
    loop,
    local_cpu_backend: LocalCPUBackend,
    config: Optional[LMCacheEngineConfig] = None,
    metadata: Optional[LMCacheMetadata] = None,
    plugin_name: Optional[str] = None,
) -> RemoteConnector:
    """The connector of the first adapter that can parse ``url``."""
    if "://" not in url:
        raise ValueError(f"invalid remote url {url}: missing scheme")
    context = ConnectorContext(url, loop, local_cpu_backend, config, metadata, plugin_name)
    for adapter in plugin_adapters(config):
        if adapter.can_parse(url):
            connector = adapter.create_connector(context)
            if RELEASE == "0.3":  # the manager finishes the connector's set-up
                connector.init_chunk_meta(config, metadata)
                connector.post_init()
            return connector
    raise ValueError(f"No adapter found for URL: {url}")
