"""fluxkv: Python client of the fluxkv DRAM+SSD key-value cache.

    import fluxkv
    with fluxkv.connect("/run/fluxkv/fluxkv.sock") as c:
        c.put("k", b"value")
        with c.get("k") as h:
            data = h.memoryview()  # zero copy, read-only

The client attaches to the local owner over its Unix socket, maps the owner's memory
segment (read-only for every view it hands out, read-write only while copying a put), and
speaks the thrift ExternalService of protocol/external.thrift. See clients/python/README.md.
"""

from fluxkv.client import Client, connect
from fluxkv.errors import AlreadyExists, Error, InvalidArgument, KeyNotFound, NoSpace, PermissionDenied, Unavailable
from fluxkv.holder import MemHolder
from fluxkv._gather import Gather
from fluxkv._wire import default_socket

__version__ = "0.1.0"

__all__ = [
    "connect",
    "Client",
    "MemHolder",
    "Gather",
    "Error",
    "KeyNotFound",
    "AlreadyExists",
    "NoSpace",
    "InvalidArgument",
    "Unavailable",
    "PermissionDenied",
    "default_socket",
    "__version__",
]
