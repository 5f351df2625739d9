"""Two owners, one master (real processes on loopback): a value put through one owner is
read through the other, pulled over the data plane (``h.remote``), byte-exact."""

from __future__ import annotations

import fluxkv


def test_remote_get(cluster):
    _, addr = cluster.master()
    a = cluster.owner(addr, "64MiB", name="a")
    b = cluster.owner(addr, "64MiB", name="b")
    ca, cb = fluxkv.connect(a.socket), fluxkv.connect(b.socket)
    try:
        values = {f"k{n}": bytes((i * 7 + n) & 0xFF for i in range(n)) for n in (1, 4097, 1 << 20, (4 << 20) + 3)}
        for k, v in values.items():
            ca.put(k, v)
        for k, v in values.items():
            with cb.get(k) as h:
                assert h.remote, k
                assert h.source == "memory"
                assert h.bytes() == v, k
            with ca.get(k) as h:
                assert not h.remote, k
        members = {m["node_id"]: m for m in cb.stat()["members"]}
        assert set(members) == {"a", "b"}
        for m in members.values():
            # Advertised, never a wildcard: the master and other owners connect to them.
            assert m["data_addr"].startswith("127.0.0.1:") and m["peer_addr"].startswith("127.0.0.1:"), m
        for k in values:
            ca.delete(k)
    finally:
        ca.close()
        cb.close()
