"""A client maps its owner's segment ahead (``populate``): a background thread faults every page
of both mappings in, so no put or get of the process takes a first-touch page fault. Checked
with the mappings' resident size in /proc/self/smaps (pages mapped in this process's page
tables), against a real owner."""

from __future__ import annotations

import fluxkv
from conftest import wait_until


def mapped_bytes(addr: int) -> int:
    """Bytes of the mapping that starts at ``addr`` mapped in this process (smaps Rss)."""
    want = f"{addr:x}-"
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            if not inside:
                inside = line.startswith(want)
                continue
            if line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping starts at {addr:#x}")


def segment_of(c: fluxkv.Client):
    return c._current().segment


def test_maps_the_segment_ahead(daemon):
    with fluxkv.connect(daemon.socket) as c:
        seg = segment_of(c)
        assert seg.populating is not None, "a 64 MiB prefaulted segment is mapped ahead by default"
        seg.populating.join(30)
        assert not seg.populating.is_alive()
        assert mapped_bytes(seg.rw_base) == seg.size
        assert mapped_bytes(seg.ro_base) == seg.size
        c.put("k", b"v" * 4096)
        with c.get("k") as h:
            assert h.bytes() == b"v" * 4096


def test_populate_off(daemon):
    with fluxkv.connect(daemon.socket, populate=False) as c:
        seg = segment_of(c)
        assert seg.populating is None
        assert mapped_bytes(seg.ro_base) < seg.size


def test_not_ahead_of_an_owner_that_did_not_allocate(cluster):
    # Mapping the holes of a segment the owner did not allocate would allocate them here.
    p = cluster.up("64MiB", "lazy", "--prefault=false")
    with fluxkv.connect(p.socket, populate=True) as c:
        seg = segment_of(c)
        assert seg.populating is None
        assert wait_until(lambda: mapped_bytes(seg.ro_base) < seg.size, 1)
