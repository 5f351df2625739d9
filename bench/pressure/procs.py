"""Child processes that never outlive the harness: servers and worker processes are started with
a parent-death signal, tracked in one group, and stopped (SIGTERM, then SIGKILL) on every way out:
normal end, an exception, Ctrl-C or SIGTERM to the harness."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Interrupted(Exception):
    """SIGTERM (or SIGINT) reached the harness: stop cleanly."""


def install_signal_handlers() -> None:
    """SIGTERM behaves as Ctrl-C: unwind through every ``finally`` (servers stopped, temp dirs
    removed). Call from the main thread."""

    def on_term(signum, frame):
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)


_T0 = time.monotonic()


def progress(msg: str) -> None:
    """A progress line on stderr, stamped with the seconds since the harness started."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def run_group(body, failures: list, what: str = "daemons") -> bool:
    """body(group) with a fresh :class:`Group`, whose processes are stopped and temp dirs removed
    afterwards, however it ends: an exception becomes a line of ``failures``, and so does a
    process that exited with an error. False when SIGTERM or Ctrl-C interrupted it."""
    with Group() as g:
        try:
            body(g)
        except (KeyboardInterrupt, Interrupted):
            progress(f"interrupted: stopping the {what}")
            return False
        except Exception as e:  # noqa: BLE001
            failures.append(repr(e))
        finally:
            progress(f"stopping the {what}")
            codes = g.close()
            # A server with no SIGTERM handler (mooncake_master) that died of the SIGTERM stopping it
            # stopped as asked.
            bad = {n: c for n, c in codes.items() if c not in (0, None, -signal.SIGTERM)}
            if bad:
                failures.append(f"{what} exited with {bad}")
    return True


class Proc:
    """One child process with a name and a log."""

    def __init__(self, name: str, args: list[str], log_path: Path | None, *, stdin=None, stdout=None, env=None, cwd=None, own_session: bool = True):
        self.name = name
        self.args = [str(a) for a in args]
        self.log_path = log_path
        self._log = open(log_path, "wb") if log_path else None
        self.p = subprocess.Popen(
            self.args,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=stdout if stdout is not None else (self._log or subprocess.DEVNULL),
            stderr=self._log if self._log else None,
            env=env,
            cwd=cwd,
            start_new_session=own_session,  # a Ctrl-C at the terminal reaches the harness alone
            preexec_fn=_die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def log_tail(self, n: int = 2000) -> str:
        if not self.log_path:
            return ""
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, SIGKILL; returns the exit status."""
        if self.p.poll() is None:
            try:
                self.p.send_signal(signal.SIGTERM)
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"warning: {self.name} (pid {self.pid}) ignored SIGTERM for {timeout:g} s; killing it", file=sys.stderr)
                self.p.kill()
                self.p.wait()
        for f in (self.p.stdin, self.p.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        if self._log:
            self._log.close()
            self._log = None
        return self.p.returncode


class Group:
    """Processes and temp dirs of one case, released in reverse order by ``close()``."""

    def __init__(self):
        self.procs: list[Proc] = []
        self.dirs: list[Path] = []

    def start(self, name: str, args: list[str], log_path: Path | None, **kw) -> Proc:
        p = Proc(name, args, log_path, **kw)
        self.procs.append(p)
        return p

    def mkdtemp(self, base: str | None, prefix: str) -> Path:
        d = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        self.dirs.append(d)
        return d

    def close(self) -> dict[str, int | None]:
        codes = {}
        for p in reversed(self.procs):
            codes[p.name] = p.stop()
        self.procs.clear()
        for d in reversed(self.dirs):
            shutil.rmtree(d, ignore_errors=True)
        self.dirs.clear()
        return codes

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_for(pred, timeout: float, what: str, proc: Proc | None = None, interval: float = 0.02):
    """Poll ``pred()`` until truthy; raise with the process's log tail if it died or time ran out."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited with status {proc.p.returncode} before {what}: {proc.log_tail()}")
        if time.monotonic() >= deadline:
            tail = f": {proc.log_tail()}" if proc is not None else ""
            raise RuntimeError(f"{what}: not within {timeout:g} s{tail}")
        time.sleep(interval)


def unix_socket_ready(path: str) -> bool:
    if not os.path.exists(path):
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def unix_request(path: str, payload: bytes, until: bytes, timeout: float = 5.0) -> bytes:
    """Send ``payload`` on a fresh Unix-socket connection; read until the reply ends with ``until``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall(payload)
        buf = bytearray()
        while not buf.endswith(until):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return bytes(buf)
    finally:
        s.close()


def tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers that need explicit ports)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def fs_type(path: str) -> str:
    """Filesystem type of the mount holding ``path`` (``tmpfs`` means the "SSD" would be RAM)."""
    best, kind = "", "unknown"
    p = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mnt = parts[1]
                    if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                        best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def cluster_auth(fluxkv_bin: str, d: Path) -> tuple[Path, Path, Path]:
    """A fresh cluster secret (mode 0600) and master key pair under d: (secret, master key,
    master public key), for --cluster-secret-file, --master-key-file, --master-pubkey-file."""
    secret = d / "cluster.secret"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(48).hex().encode())
    os.close(fd)
    mkey, mpub = d / "master.key", d / "master.pub"
    subprocess.run([fluxkv_bin, "gen-master-key", "--master-key-file", mkey, "--master-pubkey-file", mpub], check=True, capture_output=True)
    return secret, mkey, mpub
