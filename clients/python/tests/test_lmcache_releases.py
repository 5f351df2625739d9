"""fluxkv.integrations.lmcache on the older LMCache interface: the releases whose
``RemoteConnector`` has no ``__init__`` and whose ``batched_contains(keys,
stop_after_first_not_exits=True)`` answers a list (the stand-in with
``LMCACHE_STANDIN_RELEASE=0.3``: see tests/engines/lmcache/lmcache/__init__.py). There a
plugin is reached through ``remote_url`` with the plugin listed, the only form those
releases have. The 0.4 interface is tests/test_lmcache_backend.py's."""

from __future__ import annotations

import os

import pytest
import torch

from conftest import engine_standin
from test_lmcache_backend import CHUNK_TOKENS, LAYERS, chunk, key, release, run, standin_modules

# LMCache's config of those releases for a remote storage plugin: the URL in remote_url.
RELEASE_03_CONFIG = """\
chunk_size: {chunk}
local_cpu: false
remote_serde: naive
remote_url: fluxkv://{socket}
remote_storage_plugins: ["fluxkv"]
extra_config:
  remote_storage_plugin.fluxkv.module_path: fluxkv.integrations.lmcache
  remote_storage_plugin.fluxkv.class_name: FluxKVConnectorAdapter
"""


@pytest.fixture(scope="module")
def lmc():
    before = os.environ.get("LMCACHE_STANDIN_RELEASE")
    os.environ["LMCACHE_STANDIN_RELEASE"] = "0.3"
    try:
        with engine_standin("lmcache"):
            yield standin_modules()
    finally:
        if before is None:
            os.environ.pop("LMCACHE_STANDIN_RELEASE", None)
        else:
            os.environ["LMCACHE_STANDIN_RELEASE"] = before


def open_connector(lmc, socket: str, tmp_path, *, use_mla=False, extra: str = ""):
    cfg = tmp_path / f"lmcache-{len(list(tmp_path.glob('lmcache-*')))}.yaml"
    cfg.write_text(RELEASE_03_CONFIG.format(chunk=CHUNK_TOKENS, socket=socket) + extra)
    config = lmc.config.LMCacheEngineConfig.from_file(str(cfg))
    md = lmc.metadata.LMCacheMetadata("tiny", 1, 0, torch.float32, (LAYERS, 2, CHUNK_TOKENS, 2, 16), use_mla, CHUNK_TOKENS)
    cpu = lmc.cpu.LocalCPUBackend(64 << 20)
    connectors = lmc.storage.CreateRemoteConnectors(config, md, None, cpu)
    assert list(connectors) == ["RemoteBackend"]  # no plugin:// backend in these releases
    return connectors["RemoteBackend"], cpu, config, md


def test_builds_on_a_remote_connector_without_init(lmc, daemon, tmp_path):
    assert lmc.base.RemoteConnector.__init__ is object.__init__
    assert lmc.backend.lmcache_interface() == {"lmcache": None, "remote_connector_init": False, "batched_contains": "list"}
    c, cpu, config, md = open_connector(lmc, daemon.socket, tmp_path)
    assert isinstance(c, lmc.backend.FluxKVConnector) and c.socket_path == daemon.socket
    assert c.meta_fmt == lmc.mm.MemoryFormat.KV_2LTD
    # what building it the 0.4 way does on these releases (the reported failure)
    with pytest.raises(TypeError, match=r"object\.__init__\(\) takes exactly one argument"):
        lmc.base.RemoteConnector.__init__(c, config, md)
    mla, _, _, _ = open_connector(lmc, daemon.socket, tmp_path, use_mla=True)
    assert mla.meta_fmt == lmc.mm.MemoryFormat.KV_MLA_FMT
    # without saved chunk metadata the manager's init_chunk_meta sets the same format
    flat, _, _, _ = open_connector(lmc, daemon.socket, tmp_path, extra="  save_chunk_meta: false\n")
    assert flat.save_chunk_meta is False and flat.meta_fmt == lmc.mm.MemoryFormat.KV_2LTD
    for x in (c, mla, flat):
        run(x.close())
    assert cpu.live == 0


def test_batched_contains_answers_a_bool_per_key(lmc, daemon, tmp_path):
    c, cpu, _, _ = open_connector(lmc, daemon.socket, tmp_path)
    ks = [key(lmc, 0x3C0 + i) for i in range(4)]
    stored = [chunk(lmc, cpu, 60 + i) for i in (0, 1, 3)]
    run(c.batched_put([ks[0], ks[1], ks[3]], stored))
    assert c.batched_contains(ks) == [True, True, False, False]
    assert c.batched_contains(ks, stop_after_first_not_exits=True) == [True, True, False, False]
    assert c.batched_contains(ks, stop_after_first_not_exits=False) == [True, True, False, True]
    assert c.batched_contains([]) == []
    assert run(c.batched_async_contains("r", ks)) == 2  # still a count: the same in both series
    got = run(c.batched_get(ks))
    assert got[2] is None
    for want, have in zip(stored, [got[0], got[1], got[3]]):
        assert torch.equal(want.tensor, have.tensor)
    release(*stored, *got)
    run(c.close())
    assert cpu.live == 0
