"""Fixtures that run real fluxkv daemons for the client tests.

The binary is built once per session with ``go build -o <tmp>/fluxkv ./cmd/fluxkv`` from the
repository root, unless ``FLUXKV_BIN`` names one (``make test`` points it at the ``-race`` build).
Every daemon a test starts is stopped with SIGTERM at its teardown (SIGKILL only if it does not
exit within 20 s), and the test fails if it did not exit cleanly. A ``-race`` daemon runs with
``GORACE=halt_on_error=1 exitcode=66 atexit_sleep_ms=0``: a race it finds fails the test that
started it, whether it shows as a race report in the daemon's log or as exit status 66.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

PKG_DIR = Path(__file__).resolve().parents[1]  # clients/python
REPO = PKG_DIR.parents[1]
if str(PKG_DIR) not in sys.path:
    sys.path.insert(0, str(PKG_DIR))

import fluxkv  # noqa: E402

# Generous deadlines, not expected speeds: `make test` runs the -race daemon (several times
# slower) on two busy cores.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0

RACE_REPORT = "WARNING: DATA RACE"
# The exit status a -race daemon uses when it found a race (GORACE exitcode).
RACE_EXIT_CODE = 66
# A -race daemon stops at its first race with RACE_EXIT_CODE (a plain binary ignores GORACE),
# and exits without the race runtime's default one-second sleep at exit (atexit_sleep_ms).
GORACE = f"halt_on_error=1 exitcode={RACE_EXIT_CODE} atexit_sleep_ms=0"


def child_env(**extra) -> dict:
    """Environment for Python subprocesses: the package importable, nothing else changed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PKG_DIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inode(path: str):
    """Identity of a file: (inode, ctime), since a recreated socket may reuse the inode."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def _accepts(path: str) -> bool:
    """Whether a listener accepts on the Unix socket (the file appears at bind, before listen)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


class Proc:
    """One daemon process with its log file."""

    def __init__(self, args: list[str], log_path: Path, socket_path: str | None = None):
        self.args = args
        self.log_path = log_path
        self.socket = socket_path
        self.log = open(log_path, "ab")
        # A killed daemon leaves its socket file behind: readiness is a *new* socket file.
        self._stale_ino = _inode(socket_path) if socket_path else None
        # Set once a race in this daemon failed a test, so teardown does not report it twice.
        self.race_reported = False
        env = dict(os.environ, GORACE=GORACE)
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    @property
    def pid(self) -> int:
        return self.p.pid

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def race_report(self) -> str | None:
        """Why the exited daemon shows a race, or None: a race report in its log, or the race
        detector's exit status."""
        try:
            log = self.log_path.read_text(errors="replace")
        except OSError:
            log = ""
        i = log.find(RACE_REPORT)
        if i >= 0:
            # The report and what follows it (halt_on_error makes it the end of the log).
            report = log[log.rfind("\n", 0, i) + 1 :]
            if len(report) > 16000:
                report = "..." + report[-16000:]
            return f"the race detector reported a race in {self.args} (exit status {self.p.returncode}):\n{report}"
        if self.p.returncode == RACE_EXIT_CODE:
            return f"{self.args} exited with status {RACE_EXIT_CODE}, the race detector's:\n{self.log_tail()}"
        return None

    def wait_socket(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                self.stop()  # fails the test if the daemon died of a race
                raise RuntimeError(f"{self.args} exited with {self.p.returncode}:\n{self.log_tail()}")
            if self.socket is None:
                return
            ino = _inode(self.socket)
            if ino is not None and ino != self._stale_ino and _accepts(self.socket):
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"{self.socket} did not appear within {timeout} s:\n{self.log_tail()}")

    def wait_port(self, port: int, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                self.stop()  # fails the test if the daemon died of a race
                raise RuntimeError(f"{self.args} exited with {self.p.returncode}:\n{self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"port {port} did not open within {timeout} s:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the process (if running) and reap it; returns its exit status. Fails the test
        if the race detector found a race in the daemon."""
        rc = self.reap(sig)
        msg = self.race_report()
        if msg and not self.race_reported:
            self.race_reported = True
            pytest.fail(msg)
        return rc

    def reap(self, sig: int = signal.SIGTERM) -> int:
        """Signal the process (if running) and reap it; returns its exit status."""
        if self.p.poll() is None:
            try:
                self.p.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        return self.p.returncode

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)


class Cluster:
    """Starts daemons under one short temporary directory (Unix socket paths are limited
    to 107 bytes) and stops all of them at teardown."""

    def __init__(self, binary: str):
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="fkv-", dir="/tmp"))
        self.procs: list[Proc] = []
        # The cluster secret every master and owner started here shares (0600).
        self.secret = self.root / "cluster.secret"
        fd = os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(os.urandom(32)).decode() + "\n")
        # The master key pair: masters sign with the key, owners accept the public half.
        self.master_key, self.master_pub = self.root / "master.key", self.root / "master.pub"
        subprocess.run([binary, "gen-master-key", "--master-key-file", str(self.master_key),
                        "--master-pubkey-file", str(self.master_pub)], check=True, capture_output=True)

    def up(self, dram: str = "64MiB", name: str = "node", *extra: str) -> Proc:
        """A single node (``fluxkv up``) in ``root/name`` (its socket ``root/name/fluxkv.sock``),
        with ``extra`` flags."""
        d = self.root / name
        d.mkdir(exist_ok=True)
        sock = str(d / "fluxkv.sock")
        p = Proc([self.binary, "up", "--dir", str(d), "--dram", dram, *extra], self.root / f"{name}.log", sock)
        self.procs.append(p)
        p.wait_socket()
        return p

    def master(self, port: int | None = None) -> tuple[Proc, str]:
        port = port or free_port()
        addr = f"127.0.0.1:{port}"
        p = Proc([self.binary, "master", "--listen", addr, "--cluster-secret-file", str(self.secret),
                  "--master-key-file", str(self.master_key)], self.root / "master.log")
        self.procs.append(p)
        p.wait_port(port)
        return p, addr

    def owner(self, master_addr: str, dram: str = "64MiB", name: str = "owner") -> Proc:
        """An owner in DIR/name with node id name (a restart under the same name is the
        same node)."""
        d = self.root / name
        d.mkdir(exist_ok=True)
        sock = str(d / "fluxkv.sock")
        p = Proc(
            [self.binary, "owner", "--dir", str(d), "--dram", dram, "--master", master_addr,
             "--node-id", name, "--cluster-secret-file", str(self.secret), "--master-pubkey-file", str(self.master_pub)],
            self.root / f"{name}.log",
            sock,
        )
        self.procs.append(p)
        p.wait_socket()
        return p

    def close(self) -> list[str]:
        """Stop every process (owners before masters: reverse start order). Returns what went
        wrong: a race the race detector found in any daemon (not yet reported), including one a
        test already stopped or killed, and the daemons that did not exit with status 0 after
        SIGTERM."""
        problems = []
        for p in reversed(self.procs):
            running = p.p.poll() is None
            rc = p.reap()
            msg = p.race_report()
            if msg and not p.race_reported:
                p.race_reported = True
                problems.append(msg)
            elif running and rc != 0:
                problems.append(f"{p.args} exited with {rc} after SIGTERM:\n{p.log_tail()}")
        shutil.rmtree(self.root, ignore_errors=True)
        return problems


@pytest.fixture(scope="session")
def fluxkv_bin(tmp_path_factory) -> str:
    env = os.environ.get("FLUXKV_BIN")
    if env:
        if not os.access(env, os.X_OK):
            pytest.fail(f"FLUXKV_BIN={env} is not an executable")
        return env
    out = tmp_path_factory.mktemp("bin") / "fluxkv"
    r = subprocess.run(
        ["go", "build", "-o", str(out), "./cmd/fluxkv"], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    if r.returncode != 0:
        pytest.fail(f"go build ./cmd/fluxkv failed:\n{r.stdout}{r.stderr}")
    return str(out)


@pytest.fixture
def cluster(fluxkv_bin):
    c = Cluster(fluxkv_bin)
    yield c
    problems = c.close()
    if problems:
        pytest.fail("\n\n".join(problems))


@pytest.fixture
def daemon(cluster) -> Proc:
    """A single-node cache (`fluxkv up --dram 64MiB`)."""
    return cluster.up("64MiB")


@pytest.fixture
def client(daemon):
    c = fluxkv.connect(daemon.socket)
    yield c
    c.close()


@contextlib.contextmanager
def engine_standin(engine: str):
    """The stand-in of an inference engine's interface (tests/engines/<engine>) importable as
    ``<engine>`` inside the block, with fluxkv's backend for it (fluxkv.integrations.<engine>)
    imported afresh on top of it; both are gone from sys.modules, and the stand-in from
    sys.path, before and after, so no other test ever sees a fake engine."""
    path = str(Path(__file__).resolve().parent / "engines" / engine)
    backend = f"fluxkv.integrations.{engine}"

    def forget() -> None:
        for name in list(sys.modules):
            if name == engine or name.startswith(engine + ".") or name == backend:
                del sys.modules[name]

    forget()
    sys.path.insert(0, path)
    try:
        yield
    finally:
        sys.path.remove(path)
        forget()


def shared_node(binary: str, dram: str, name: str):
    """A generator for a module-scoped fixture: one single-node cache shared by a module's tests,
    stopped (and checked for a clean exit) after the last of them."""
    c = Cluster(binary)
    try:
        p = c.up(dram, name=name)
    except BaseException:
        c.close()
        raise
    yield p
    problems = c.close()
    if problems:
        pytest.fail("\n\n".join(problems))


@pytest.fixture(scope="module")
def big_daemon(fluxkv_bin):
    """A 128 MiB single-node cache shared by one module's size tests."""
    yield from shared_node(fluxkv_bin, "128MiB", "big")


def local_member(st: dict) -> dict:
    for m in st["members"]:
        if m["node_id"] == st["node_id"]:
            return m
    raise AssertionError(f"node {st['node_id']!r} is not among the members: {st}")


def used_bytes(c: fluxkv.Client) -> int:
    return local_member(c.stat())["memory_segment"]["used_bytes"]


def wait_until(pred, timeout: float, interval: float = 0.02):
    """Poll pred() until it returns a truthy value or timeout passes; returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)
