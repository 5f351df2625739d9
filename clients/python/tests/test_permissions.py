"""Who may attach (docs/architecture.md §11): the owner's uid, root, and members of the socket's group,
primary or supplementary. Clients of another uid are run with setpriv (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import child_env

# The group the test gives the node's sockets; it needs no entry in /etc/group.
GID = 4242

CHILD = r"""
import sys, fluxkv
try:
    c = fluxkv.connect(sys.argv[1])
except fluxkv.PermissionDenied as e:
    assert isinstance(e, fluxkv.Error) and e.code == 9, (type(e), e.code)
    print("DENIED", e)
    sys.exit(0)
c.put(b"perm-key", b"v" * 5000)
with c.get(b"perm-key") as h:
    assert h.bytes() == b"v" * 5000
print("ATTACHED")
c.close()
"""

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: clients of other uids are run with setpriv"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not installed"),
]


@pytest.fixture
def grouped(cluster):
    """A node whose sockets belong to GID, reachable by other uids."""
    node = cluster.up("16MiB")
    d = os.path.dirname(node.socket)
    for p in (os.path.dirname(d), d):
        os.chmod(p, 0o755)
    socks = [node.socket, node.socket + ".rpc"]
    for s in socks:
        os.chown(s, -1, GID)
    return node, socks


def run_child(sock: str, *setpriv_args: str) -> str:
    r = subprocess.run(
        ["setpriv", "--reuid=65534", *setpriv_args, sys.executable, "-c", CHILD, sock],
        env=child_env(), capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_supplementary_group_attaches(grouped):
    node, _ = grouped
    out = run_child(node.socket, "--regid=65534", f"--groups={GID}")
    assert "ATTACHED" in out, out


def test_non_member_refused_by_socket(grouped):
    node, _ = grouped
    out = run_child(node.socket, "--regid=65534", "--clear-groups")
    assert "DENIED" in out and "cannot connect" in out and "usermod -aG" in out, out


def test_non_member_refused_by_owner(grouped):
    node, socks = grouped
    for s in socks:
        os.chmod(s, 0o666)
    out = run_child(node.socket, "--regid=65534", "--clear-groups")
    assert "DENIED" in out and "may not attach" in out and "next login" in out, out
