"""fluxkv: ``fluxkv up`` (embedded master + owner) with ``--dram`` and, SSD on, an SSD cache dir
and limit; the Python client ``fluxkv`` in every benchmark process (one client per process,
shared by its threads, as an inference process would). Sources come per get from
``MemHolder.source``."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from ..procs import unix_socket_ready, wait_for
from .base import CaseSpec, Got, Server as _Server, ThreadClient, WorkerSide as _WorkerSide, module_available, settle_by_polling, which


REPO = Path(__file__).resolve().parents[3]


def add_arguments(g) -> None:
    g.add_argument("--fluxkv-bin", default=str(REPO / "bin" / "fluxkv"), help="the fluxkv binary (make build)")
    g.add_argument("--fluxkv-pythonpath", default=str(REPO / "clients" / "python"), help="where the fluxkv Python client lives")
    g.add_argument("--fluxkv-up-args", default="", help="extra flags for 'fluxkv up' (ablations: '--no-promotion', '--cache-grace 0'); "
                   "recorded in the summary's server field")


def _ssd_flag_style(binary: str) -> str | None:
    """Which SSD flags this daemon build takes: ``ssd`` (--ssd-path/--ssd-limit), ``large``
    (--large-file-paths/--large-limit-size) or None."""
    try:
        out = subprocess.run([binary, "up", "--help"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout + out.stderr
    if "--ssd-path" in text and "--ssd-limit" in text:
        return "ssd"
    if "--large-file-paths" in text and "--large-limit-size" in text:
        return "large"
    return None


class Server(_Server):
    name = "fluxkv"
    source_method = "per-get"

    def __init__(self, opts):
        super().__init__(opts)
        self.bin = str(Path(opts.fluxkv_bin).resolve()) if opts.fluxkv_bin else None
        self.pythonpath = (str(Path(opts.fluxkv_pythonpath).resolve()),)
        self._flag_style: str | None | bool = False  # False: not probed yet
        self.socket: str | None = None
        self.case_ssd = False
        self.proc = None

    def _ssd_style(self):
        if self._flag_style is False:
            self._flag_style = _ssd_flag_style(self.bin)
        return self._flag_style

    def unavailable(self, case: CaseSpec) -> str | None:
        if not self.bin or not which(self.bin):
            return f"fluxkv binary {self.opts.fluxkv_bin!r} not found (make build)"
        if not module_available("fluxkv", self.pythonpath):
            return f"Python client 'fluxkv' not importable from {self.pythonpath[0]}"
        if not module_available("thrift", self.pythonpath):
            return "Python module 'thrift' (the fluxkv client's runtime) not importable: install python3-thrift or use --pythonpath"
        if case.ssd and self._ssd_style() is None:
            return f"{self.bin} up takes no SSD flags (--ssd-path/--ssd-limit or --large-file-paths/--large-limit-size)"
        return None

    def start(self, case: CaseSpec, workdir: Path, group) -> dict:
        self.socket = str(workdir / "fluxkv.sock")
        self.case_ssd = case.ssd
        args = [self.bin, "--log-level", "warn", "up", "--dir", str(workdir), "--dram", str(case.dram_bytes)]
        if case.ssd:
            ssd_dir = workdir / "ssd"
            ssd_dir.mkdir()
            if self._ssd_style() == "ssd":
                args += ["--ssd-path", str(ssd_dir), "--ssd-limit", str(case.ssd_bytes)]
            else:
                args += ["--large-file-paths", str(ssd_dir), "--large-limit-size", str(case.ssd_bytes)]
        args += shlex.split(self.opts.fluxkv_up_args or "")
        self.cmdline = args
        self.proc = group.start("fluxkv", args, workdir / "fluxkv.log")
        wait_for(lambda: unix_socket_ready(self.socket), 60, "fluxkv socket", self.proc)
        return {"socket": self.socket, "pythonpath": list(self.pythonpath)}

    def _status(self) -> dict:
        out = subprocess.run([self.bin, "status", "--json", "--socket", self.socket], capture_output=True, text=True, timeout=20)
        if out.returncode != 0:
            raise RuntimeError(f"fluxkv status: {out.stderr.strip() or out.stdout.strip()}")
        return json.loads(out.stdout)

    def settle(self, timeout: float) -> None:
        """SSD writes run after each put returns: wait until the SSD replica count and used bytes
        stop moving. ``kv_ssd.used_bytes`` comes with the owner's heartbeat (1 s), so watch for
        more than one heartbeat."""
        if not self.case_ssd:
            return

        def sample():
            st = self._status()
            return tuple((m.get("ssd_replicas"), (m.get("kv_ssd") or {}).get("used_bytes")) for m in st.get("members", []))

        settle_by_polling(sample, timeout, interval=0.3, stable_for=5)

    def describe(self) -> dict:
        st = self._status()
        out = {"keys": st.get("keys")}
        for m in st.get("members", []):
            seg = m.get("memory_segment") or {}
            ssd = m.get("kv_ssd") or {}
            out.update(
                memory_capacity_bytes=seg.get("capacity_bytes"),
                memory_used_bytes=seg.get("used_bytes"),
                ssd_capacity_bytes=ssd.get("capacity_bytes"),
                ssd_used_bytes=ssd.get("used_bytes"),
                memory_replicas=m.get("memory_replicas"),
                ssd_replicas=m.get("ssd_replicas"),
            )
        return out


class FluxGot(Got):
    __slots__ = ("h", "source")

    def __init__(self, h):
        self.h = h
        self.source = h.source

    def __len__(self) -> int:
        return len(self.h)

    def materialize(self) -> bytes:
        return self.h.bytes()

    def host_pointer(self) -> int:
        return self.h.address

    def release(self) -> None:
        self.h.release()


class FluxThread(ThreadClient):
    def __init__(self, client, fluxkv_mod):
        self.c = client
        self.KeyNotFound = fluxkv_mod.KeyNotFound

    def get(self, key: str):
        try:
            return FluxGot(self.c.get(key))
        except self.KeyNotFound:
            return None

    def put(self, key: str, value) -> None:
        self.c.put(key, value)


class WorkerSide(_WorkerSide):
    native_type = "MemHolder"

    def __init__(self, endpoint: dict, case: CaseSpec, proc_index: int):
        super().__init__(endpoint, case, proc_index)
        for p in reversed(endpoint.get("pythonpath", [])):
            if p not in sys.path:
                sys.path.insert(0, p)
        import fluxkv

        self.mod = fluxkv
        self.client = fluxkv.connect(endpoint["socket"])

    def thread_client(self, thread_index: int) -> ThreadClient:
        return FluxThread(self.client, self.mod)

    def close(self) -> None:
        self.client.close()
