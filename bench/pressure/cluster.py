"""The cluster benchmark (issue 14 item 4): fluxkv as a master and N owners on this machine, one
or more of them with SSD, benchmark process i attached to an owner, every hit attributed from its
own response to memory or SSD, on this owner or pulled from another; beside it, in the same run,
the limit (a plain Go TCP sender and receiver, two processes, over loopback moving the same bytes:
``tcp-raw``)
and Mooncake Store's multi-process topology where it is installed.

    python3 -m pressure cluster --out DIR [--preset quick|full] [flags]

Paths (``path`` in summary.jsonl), each a case of its own (a fresh cluster):

* ``mixed``: the single-node benchmark's workload on the cluster: dataset = ratio × the cluster's
  DRAM, bootstrapped serially through every owner in turn (paced as the seed), Zipf get-only or
  read-through, process i on owner i mod N, promotion and the owners' cache as by default.
* ``remote-memory``: every hit a pull. The dataset (fits one owner) is put through one owner that
  has no SSD, with ``master --placement local --no-promotion``; readers sit on the other owners
  (``--cache-grace 0``), which hold no replica.
* ``remote-ssd``: every hit a remote SSD refill. The dataset is put through every owner in turn
  (so it reaches SSD whichever rule places the SSD copy), the harness waits for the SSD replica
  count to settle, then puts unpaced filler values (``filler-…``, never read) through every owner
  until the memory pool has turned over, waits again, and readers on the owners *without* SSD
  (promotion off, ``--cache-grace 0``) read the dataset. A second window on the same cluster with
  the readers on the SSD owner gives ``local-ssd`` (kind ``reference``): the same disk's local
  SSD-hit rate. Rows count what really happened (``ssd_remote_hits`` …), never what should have.

Dropped SSD persists: every row's ``dropped_persists`` is the master's count of persists that ended
without an SSD copy (``ssd_persists_dropped`` of ``fluxkv status --json``, summed over the members,
at the end of the case), and ``persists`` adds the per-member counters and the SSD replicas found
after the bootstrap settled against the keys put.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import harness
from .backends import fluxkv as fx
from .backends.base import CaseSpec
from .matrix import Case, parse_workers
from .procs import Group, Interrupted, fs_type
from .sizes import format_size, label_size, parse_size
from .stats import PLACES, split_all_remote, split_by_place, split_unplaced
from .workload import key_count

REPO = Path(__file__).resolve().parents[2]
clock = time.monotonic

PATHS = ("mixed", "remote-memory", "remote-ssd")
REFERENCE_PATH = "local-ssd"  # comes with remote-ssd: its second window
MOONCAKE_VARIANT = "dedicated_owner"  # its multi-process topology: every hit crosses its TCP transport
# The mixed path's: every benchmark process stores and requests, as fluxkv's clients do on every
# owner there (its local hits are each system's own to make; against dedicated_owner, whose hits all
# cross TCP, fluxkv's zero-copy local hits inflated the ratio).
MOONCAKE_MIXED_VARIANT = "per_process"
# Cluster layouts: processes first, so that c2 already spans two owners.
CLUSTER_WORKERS = {"c2": (2, 1), "c4": (4, 1), "c8": (4, 2), "c16": (4, 4)}
SIXTEEN_MIB = 16 << 20

# Fields of a cluster row besides the pressure harness's SCHEMA.
EXTRA = (
    "kind", "path", "owners", "owner_dram_bytes", "memory_local_hits", "memory_remote_hits", "ssd_local_hits", "ssd_remote_hits",
    "place_method", "dropped_persists", "persists", "filler", "x_tcp_raw", "x_local_ssd", "load_avg",
    "distinct_values", "duplicate_bytes", "pool", "one_process_gib_s",
)
SCHEMA = harness.SCHEMA + EXTRA


@dataclass(frozen=True)
class ClusterCase(Case):
    path: str | None = "mixed"

    def label(self) -> str:
        rt = "get-only" if self.on_miss == "none" else "read-through"
        b = self.backend + (f"/{self.variant}" if self.variant else "")
        return f"{b} {self.path or ''} ssd={'on' if self.ssd else 'off'} {self.mode} {rt} {format_size(self.payload_bytes)} {self.concurrency}({self.procs}x{self.threads})"


@dataclass(frozen=True)
class TcpRaw:
    """A tcp-raw measurement: at the start of a payload × layout group, and again at its end
    (``again``), merged into the first row: the limit is the better of the two, both are kept."""

    payload_bytes: int
    procs: int
    threads: int
    again: bool = False

    def label(self) -> str:
        return f"tcp-raw {format_size(self.payload_bytes)} c{self.procs * self.threads}{' (again, end of the group)' if self.again else ''}"


def parse_cluster_workers(text: str) -> tuple[int, int]:
    t = text.strip().lower()
    return CLUSTER_WORKERS[t] if t in CLUSTER_WORKERS else parse_workers(t)


# -- sizes and topologies --------------------------------------------------------------------------


def total_dram(opts) -> int:
    return opts.owners * opts.owner_dram


def dataset_bytes(path: str, opts) -> int:
    if path == "remote-memory":
        return int(opts.remote_memory_ratio * opts.owner_dram)
    return int(opts.dataset_ratio * total_dram(opts))


def filler_size(opts, payload: int) -> int:
    """Filler values are as large as an owner takes in one put through another owner (its transfer
    reserve, min(DRAM/8, 256 MiB), capped at 16 MiB) and never smaller than the payload: fewer,
    larger puts turn the memory pool over in less time than payload-sized ones."""
    return max(payload, min(16 << 20, opts.owner_dram // 8, 256 << 20) - 128)


def filler_count(opts, payload: int) -> int:
    return key_count(int(opts.filler_ratio * total_dram(opts)), filler_size(opts, payload))


def ssd_owner_indices(opts) -> tuple:
    return tuple(range(opts.ssd_owners))


def landing_bytes(case: ClusterCase, opts, attached: int) -> int:
    """Each owner's landing area (--landing-reserve) on the mixed path: ``--fluxkv-landing`` as
    given, or (auto) room for twice the gets the benchmark threads attached to one owner have in
    flight, of the case's payload. It is memory beyond the owner's DRAM, as a Mooncake client's
    local buffer (--mooncake-local-buffer, per benchmark process) is beyond its segment."""
    if opts.fluxkv_landing in ("0", "off"):
        return 0
    if opts.fluxkv_landing != "auto":
        return parse_size(opts.fluxkv_landing)
    per_owner = -(-case.procs // max(attached, 1)) * case.threads
    return 2 * per_owner * case.payload_bytes


def topology_for(case: ClusterCase, opts) -> fx.Topology:
    n = opts.owners
    ssd = ssd_owner_indices(opts) if case.ssd else ()
    plain = [i for i in range(n) if i not in ssd_owner_indices(opts)]
    every = tuple(range(n))
    base = dict(owners=n, dram_bytes=opts.owner_dram, ssd_owners=ssd, ssd_bytes=opts.ssd_size if ssd else 0)
    if case.path == "mixed":
        return fx.Topology(**base, attach=every, put_via=every, landing_bytes=landing_bytes(case, opts, len(every)))
    if case.path == "remote-memory":
        home = plain[0] if plain else 0
        readers = tuple(i for i in every if i != home)
        return fx.Topology(**base, attach=readers, put_via=(home,), no_promotion=True, placement="local", cache_grace="0")
    if case.path == "remote-ssd":
        return fx.Topology(**base, attach=tuple(plain), put_via=every, no_promotion=True, cache_grace="0")
    raise ValueError(f"unknown path {case.path!r}")


def unavailable_path(case: ClusterCase, opts) -> str | None:
    if case.path == "remote-ssd" and not (0 < opts.ssd_owners < opts.owners):
        return f"remote-ssd needs owners with and without SSD (owners {opts.owners}, SSD owners {opts.ssd_owners})"
    if case.path == "remote-memory" and opts.owners < 2:
        return "remote-memory needs 2 owners or more"
    return None


# -- records ---------------------------------------------------------------------------------------


def new_record(case: ClusterCase, opts, keys: int, kind: str = "measured") -> dict:
    return harness.case_record(SCHEMA, case, opts, keys, kind=kind)


def finish_split(rec: dict, split) -> None:
    rec.update(split.fields(), place_method=split.method)
    if split.note:
        rec["notes"].append(split.note)
    if not split.complete and rec["status"] == "ok":
        rec.update(status="incomplete", complete=False)


T0 = [clock()]  # the run's start (progress lines show seconds since)


def say(msg: str) -> None:
    print(f"    [{clock() - T0[0]:6.1f}s] {msg}", file=sys.stderr, flush=True)


# -- one fluxkv cluster case -----------------------------------------------------------------------


def _ssd_replicas(srv) -> int | None:
    try:
        return srv.describe().get("ssd_replicas")
    except Exception:
        return None


def run_fluxkv(case: ClusterCase, ctx: harness.Context) -> list[dict]:
    """One fresh cluster: bootstrap, (remote-ssd: filler), window(s). One record, or two for
    remote-ssd (its local-ssd reference window on the same cluster)."""
    opts = ctx.opts
    keys = key_count(dataset_bytes(case.path, opts), case.payload_bytes)
    rec = new_record(case, opts, keys)
    records = [rec]
    why = unavailable_path(case, opts)
    topo = None if why else topology_for(case, opts)
    if topo is not None:
        rec.update(owners=topo.owners, owner_dram_bytes=topo.dram_bytes, dram_bytes=topo.owners * topo.dram_bytes,
                   ssd_bytes=len(topo.ssd_owners) * topo.ssd_bytes)
    ref = None
    if case.path == "remote-ssd":
        ref = new_record(replace(case, path=REFERENCE_PATH), opts, keys, kind="reference")
        ref.update({k: rec[k] for k in ("owners", "owner_dram_bytes", "dram_bytes", "ssd_bytes")})
        records.append(ref)
    if why:
        for r in records:
            r.update(status="unavailable", reason=why)
        return records
    spec = CaseSpec("fluxkv", None, case.ssd, case.mode, case.payload_bytes, keys, topo.dram_bytes, topo.ssd_bytes, case.procs, case.threads)
    srv = fx.Cluster(opts, topo)
    if not harness.prepare(case, ctx, srv, spec, rec):
        for r in records[1:]:
            r.update(status=rec["status"], reason=rec["reason"])
        return records
    for r in records:
        r["server"] = {"topology": topo.to_json()}
    fill_bytes = filler_count(opts, case.payload_bytes) * filler_size(opts, case.payload_bytes)
    if case.path == "remote-ssd" and len(topo.ssd_owners) * topo.ssd_bytes < 1.1 * (keys * case.payload_bytes + fill_bytes):
        rec["notes"].append("SSD smaller than dataset + filler: the ring may evict dataset values (misses)")

    group = Group()
    workers: list[harness.Worker] = []
    finished = False
    windows = []  # (record, results, samples, skew)
    persists: dict = {"source": "fluxkv status --json: ssd_persists, ssd_persists_dropped, ssd_persists_pending per member", "keys": keys}
    try:
        workdir = group.mkdtemp(opts.work_dir, "fkc-")
        endpoint = srv.start(spec, workdir, group)
        label = f"fluxkv {case.path} ssd={'on' if case.ssd else 'off'}"
        cfg = harness.worker_config(case, spec, ctx, srv, endpoint, label)
        ready = harness.start_workers(group, ctx, srv, cfg, case.procs, workers)
        rec["client"] = {"native_type": ready[0].get("native_type"), "attach": [(r.get("describe") or {}).get("owner") for r in ready],
                         "put_via": list(topo.put_via)}
        say(f"cluster up: {topo.owners} owners x {format_size(topo.dram_bytes)} DRAM, SSD on {[fx.owner_id(i) for i in topo.ssd_owners] or 'none'}; "
            f"readers on {[fx.owner_id(i) for i in rec['client']['attach']]}, puts through {[fx.owner_id(i) for i in topo.put_via]}")
        harness.bootstrap(workers[0], case, keys, opts, rec)
        say(f"bootstrap: {rec['bootstrap']['puts']} puts ({rec['bootstrap']['failed']} failed) in {rec['bootstrap']['seconds']:.1f} s")
        if case.ssd:
            srv.settle(opts.settle_timeout)
            persists["ssd_replicas_after_bootstrap"] = _ssd_replicas(srv)
            say(f"settled: {persists['ssd_replicas_after_bootstrap']} SSD replicas of {keys} keys")
        else:
            persists["ssd_replicas_after_bootstrap"] = 0
        persists["bootstrap"] = srv.persist_counts()
        pool = {"after_bootstrap": srv.pool_counts()}
        if case.path == "remote-ssd":
            n, size = filler_count(opts, case.payload_bytes), filler_size(opts, case.payload_bytes)
            workers[0].send({"cmd": "fill", "count": n, "size": size})
            fill = workers[0].recv(n * 10.0 + 120, "filled")
            fill.pop("event", None)
            rec["filler"] = fill
            say(f"filler: {fill['puts']} x {format_size(size)} ({fill['failed']} failed) in {fill['seconds']:.1f} s")
            srv.settle(opts.settle_timeout)
            persists["ssd_replicas_after_filler"] = _ssd_replicas(srv)
            say(f"settled: {persists['ssd_replicas_after_filler']} SSD replicas")
        harness.describe_server(srv, rec)
        rec["server"]["cmd"] = srv.cmd()
        rec["server"]["binary"] = binary_identity(srv.bin)
        say(f"window {case.path}")
        windows.append((rec, *harness.measure(workers, srv, case, opts)))
        rec["pool"] = {**pool, "end": srv.pool_counts()}
        if ref is not None:
            harness.stop_workers(workers, True)
            workers.clear()
            ref_cfg = harness.worker_config(case, spec, ctx, srv, srv.endpoint(topo.ssd_owners), label + " (readers on the SSD owner)")
            ready = harness.start_workers(group, ctx, srv, ref_cfg, case.procs, workers)
            ref.update(client={**rec["client"], "attach": [(r.get("describe") or {}).get("owner") for r in ready]},
                       bootstrap=rec["bootstrap"], filler=rec["filler"], server=rec["server"])
            say(f"window {REFERENCE_PATH} (same cluster)")
            windows.append((ref, *harness.measure(workers, srv, case, opts)))
            ref["pool"] = {**pool, "end": srv.pool_counts()}
        persists["end"] = srv.persist_counts()
        finished = True
    except (KeyboardInterrupt, Interrupted):
        raise
    except Exception as e:
        for r in records:
            if r["status"] is None:
                r.update(status="failed", reason=f"{type(e).__name__}: {e}"[:3000])
        return records
    finally:
        harness.stop_workers(workers, finished)
        harness.stop_servers(srv, group, rec)

    dropped = (persists.get("end") or {}).get("dropped")
    for r, results, samples, skew in windows:
        tally = harness.account(r, case, srv, results, samples, skew, opts.window)
        end = (r.get("pool") or {}).get("end") or {}
        r.update(dropped_persists=dropped, persists=persists, distinct_values=end.get("values"), duplicate_bytes=end.get("duplicate_bytes"))
        if tally is not None:
            finish_split(r, split_by_place(tally.hits, tally.by_place))
        harness.fail_if_servers_died(r, rec)
    if ref is not None and ref["hit_gib_s"]:
        rec["x_local_ssd"] = rec["hit_gib_s"] / ref["hit_gib_s"] if rec["hit_gib_s"] is not None else None
    return records


_identities: dict = {}


def binary_identity(path: str) -> dict:
    """Which build ran (the binary may be rebuilt between runs): sha256 prefix and mtime."""
    import hashlib

    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _identities:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _identities[key] = {"path": path, "sha256": h.hexdigest()[:16],
                            "mtime": datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).isoformat(timespec="seconds")}
    return _identities[key]


# -- Mooncake Store (where installed) --------------------------------------------------------------


def run_mooncake(case: ClusterCase, ctx: harness.Context) -> dict:
    """Mooncake through the pressure harness's Mooncake backend, with the cluster's sizes: on the
    remote paths its dedicated-owner topology (one resident store process holding the cluster's
    DRAM, and SSD; the benchmark processes only request, so every hit crosses its TCP transport),
    on the mixed path per_process (every benchmark process stores and requests, holding its share
    of the DRAM and SSD: whether a hit was local it does not say)."""
    opts = copy.copy(ctx.opts)
    opts.dram = total_dram(ctx.opts)
    opts.ssd_size = ctx.opts.ssd_size * max(1, ctx.opts.ssd_owners)
    opts.dataset = dataset_bytes(case.path, ctx.opts)
    base = Case("mooncake", case.ssd, case.mode, case.on_miss, case.order, case.payload_bytes, case.procs, case.threads,
                case.variant or mooncake_variant(case.path))
    r = harness.run_case(base, harness.Context(opts))
    rec = {k: None for k in SCHEMA}
    rec.update(r)
    rec.update(kind="measured", path=case.path, owners=1, owner_dram_bytes=opts.dram)
    if r["status"] in ("ok", "incomplete"):
        if base.variant == MOONCAKE_VARIANT:
            finish_split(rec, split_all_remote(r["hits"], r["memory_hits"], r["ssd_hits"], r["unknown_hits"]))
            rec["notes"].append("mooncake dedicated_owner: the benchmark processes store nothing, so every hit is remote")
        else:
            finish_split(rec, split_unplaced(f"mooncake {base.variant}: it does not say which hits were local"))
    return rec


# -- tcp-raw: the limit ----------------------------------------------------------------------------


def remoteget_binary(opts, scratch: Path) -> tuple[str | None, str | None]:
    """(bench/remoteget binary, None) or (None, why not): ``--remoteget-bin``, else built with go."""
    if opts.remoteget_bin and os.access(opts.remoteget_bin, os.X_OK):
        return str(Path(opts.remoteget_bin).resolve()), None
    out = scratch / "fluxkv-remoteget"
    try:
        p = subprocess.run([opts.go, "build", "-o", str(out), "./bench/remoteget"], cwd=REPO, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"no {opts.remoteget_bin} and go build failed: {type(e).__name__}: {e}"
    if p.returncode:
        return None, f"no {opts.remoteget_bin} and go build ./bench/remoteget failed: {p.stderr.strip()[-400:]}"
    return str(out), None


# The pairs tcp-raw measures: its figures are the two-process pair's (an owner's pull crosses
# processes, in production hosts); the one-process pair is recorded beside it. On a few cores the
# one-process pair's sender and receiver goroutines of a connection often share a core, whose cache
# then holds the bytes between the two kernel copies: at c2 on this 2-core VM it moves about twice
# what two processes move (16 MiB: 6.0 against 4.0 GiB/s; one process pinned to one core, c1: 5.4),
# a speed no pull between owners can have.
TCP_PAIRS = (("processes", ["-tcp-pair", "-child-pair"]), ("one process", ["-tcp-pair"]))


def run_tcp_raw(payload: int, procs: int, threads: int, ctx: harness.Context, binary: str | None, why: str | None) -> dict:
    """bench/remoteget -tcp-pair: conc goroutines, each with its own loopback connection, ask for
    ``payload`` bytes and read them into a reused buffer, from a sender in a child process (the
    row's figures) and from one in the same process (``one_process_gib_s``); warmup and window as
    the other rows."""
    opts = ctx.opts
    conc = procs * threads
    case = ClusterCase("tcp-raw", False, "raw", "none", "-", payload, 1, conc, None, None)
    rec = new_record(case, opts, 0, kind="baseline")
    rec.update(order=None, keys=None, dataset_bytes=None, seed=None, zipf_theta=None)
    if binary is None:
        rec.update(status="unavailable", reason=why)
        return rec
    runs, cmds = [], []
    for pair, flags in TCP_PAIRS:
        cmd = [binary, *flags, "-size", str(payload), "-conc", str(conc), "-duration", f"{opts.window}s", "-warmup", f"{opts.warmup}s"]
        cmds.append(" ".join(shlex.quote(a) for a in cmd))
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.window + opts.warmup + 120)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if p.returncode or not lines:
                raise RuntimeError(f"exit {p.returncode}: {p.stderr.strip()[-1000:]}")
            r = json.loads(lines[-1])
        except (OSError, subprocess.TimeoutExpired, RuntimeError, ValueError) as e:
            rec.update(status="failed", reason=f"{' '.join(cmd)}: {type(e).__name__}: {e}"[:2000], server={"cmd": " ; ".join(cmds)})
            return rec
        runs.append({"pair": pair, "ops": int(r["ops"]), "seconds": round(float(r["seconds"]), 3), "gib_s": float(r["gib_per_s"]),
                     "p50_us": round(float(r["p50_us"]), 1), "p99_us": round(float(r["p99_us"]), 1), "errors": int(r.get("errors") or 0),
                     "started_at": rec["started_at"], "load_avg_1m": round(os.getloadavg()[0], 2)})
        if r.get("first_error"):
            rec["notes"].append(f"first error ({pair}): {r['first_error']}")
    rec["server"] = {"cmd": " ; ".join(cmds)}
    rec.update(status="ok", complete=True, client={"tool": "bench/remoteget -tcp-pair [-child-pair]", "goroutines": conc, "connections": conc, "runs": runs})
    _tcp_best(rec)
    return rec


def _tcp_best(rec: dict) -> None:
    """The row's figures are its best two-process run's (the limit); the best one-process run's
    GiB/s is ``one_process_gib_s``; every run stays in ``client.runs``."""
    runs = rec["client"]["runs"]
    b = max((x for x in runs if x["pair"] == "processes"), key=lambda x: x["gib_s"])
    rec.update(hits=b["ops"], misses=0, errors=sum(x["errors"] for x in runs), hit_rate=1.0 if b["ops"] else None, hit_gib_s=b["gib_s"],
               ops_per_s=b["ops"] / b["seconds"] if b["seconds"] else None, p50_us=b["p50_us"], p99_us=b["p99_us"], window_s=b["seconds"],
               one_process_gib_s=max((x["gib_s"] for x in runs if x["pair"] == "one process"), default=None))


def merge_tcp_raw(first: dict, again: dict) -> None:
    """Fold the end-of-group measurement into the group's tcp-raw row."""
    if again["status"] != "ok":
        first["notes"].append(f"tcp-raw again at the end of the group: {again['status']}: {again.get('reason')}")
        return
    if first["status"] != "ok":
        first.update({k: v for k, v in again.items() if k not in ("notes", "started_at")})
        return
    first["client"]["runs"] += again["client"]["runs"]
    _tcp_best(first)
    gs = [x["gib_s"] for x in first["client"]["runs"] if x["pair"] == "processes"]
    if min(gs) < 0.8 * max(gs):
        first["notes"].append(f"tcp-raw moved from {gs[0]:.2f} to {gs[-1]:.2f} GiB/s between the start and the end of the group "
                              "(load on this machine changed): ratios to it are uncertain")


# -- the matrix ------------------------------------------------------------------------------------


def mixed_kinds(opts) -> list[tuple[bool, str]]:
    """(SSD on, on_miss) of the mixed cases: the quick preset's get-only off/on + read-through off,
    unless --ssd / --on-miss were given (then their cross product)."""
    if opts.mixed_kinds is not None:
        return opts.mixed_kinds
    return [(ssd, om) for om in opts.on_miss_list for ssd in opts.ssd_list]


def cases_for(opts) -> list:
    """Per payload and layout: the tcp-raw baseline, fluxkv's paths, Mooncake's (where asked)."""
    out: list = []
    ssd_paths = opts.ssd_owners > 0
    for payload in opts.payload_list:
        for procs, threads in opts.worker_list:
            if opts.tcp_raw:
                out.append(TcpRaw(payload, procs, threads))
            for backend in opts.backend_list:
                for path in opts.path_list:
                    for mode in opts.path_modes[path]:
                        if path == "mixed":
                            kinds = mixed_kinds(opts)
                        elif path == "remote-memory":  # the memory path: no SSD tier to wait for or perturb it
                            kinds = [(False, "none")]
                        else:
                            kinds = [(True, "none")]
                        if backend == "mooncake" and path == "remote-ssd":
                            continue  # no counterpart: its requesters never hold a replica (all paths are remote)
                        for ssd, om in kinds:
                            out.append(ClusterCase(backend, ssd, mode, om, opts.bootstrap_order, payload, procs, threads,
                                                   mooncake_variant(path) if backend == "mooncake" else None, path))
            if opts.tcp_raw:
                out.append(TcpRaw(payload, procs, threads, again=True))
    return out


def mooncake_variant(path: str) -> str:
    return MOONCAKE_MIXED_VARIANT if path == "mixed" else MOONCAKE_VARIANT


def add_ratios(records: list[dict]) -> None:
    """``x_tcp_raw``: a row's hit GiB/s ÷ the tcp-raw row of the same payload and concurrency."""
    tcp = {(r["payload_bytes"], r["concurrency"]): r["hit_gib_s"] for r in records if r["backend"] == "tcp-raw" and r["status"] == "ok"}
    for r in records:
        base = tcp.get((r["payload_bytes"], r["concurrency"]))
        if r["backend"] != "tcp-raw" and base and r.get("hit_gib_s") is not None:
            r["x_tcp_raw"] = r["hit_gib_s"] / base


# -- goals (issue 14 item 4) -----------------------------------------------------------------------


def goals(records: list[dict]) -> list[dict]:
    """The note's goals, checked on this run's rows (at 16 MiB − 128 B, or the largest payload)."""
    ok = [r for r in records if r["status"] in ("ok", "incomplete")]
    out = []
    big = max((r["payload_bytes"] for r in ok), default=None)
    at = [p for p in {r["payload_bytes"] for r in ok} if abs(p - SIXTEEN_MIB) <= 4096] or ([big] if big else [])

    def pick(**kw):
        return [r for r in ok if all(r.get(k) == v for k, v in kw.items())]

    for p in at:
        for r in pick(backend="fluxkv", path="remote-memory", payload_bytes=p):
            # (every hit pulled from another owner: local hits are no transfer to compare)
            remote_share = (r["memory_remote_hits"] or 0) / r["hits"] if r["hits"] else None
            out.append({"goal": "remote-memory >= 0.7x tcp-raw", "payload": p, "concurrency": r["concurrency"], "mode": r["mode"], "value": r["x_tcp_raw"],
                        "met": None if r["x_tcp_raw"] is None else (r["x_tcp_raw"] >= 0.7 and remote_share == 1.0 and not r["errors"]),
                        "remote_memory_share_of_hits": remote_share})
        for r in pick(backend="fluxkv", path="remote-ssd", payload_bytes=p):
            remote_share = (r["ssd_remote_hits"] or 0) / r["hits"] if r["hits"] else None
            out.append({"goal": "remote-ssd >= 0.7x local SSD-hit GiB/s", "payload": p, "concurrency": r["concurrency"], "mode": r["mode"], "value": r["x_local_ssd"],
                        "met": None if r["x_local_ssd"] is None else (r["x_local_ssd"] >= 0.7 and remote_share == 1.0 and not r["errors"]),
                        "remote_ssd_share_of_hits": remote_share})
    for r in pick(backend="fluxkv", path="mixed", ssd=True, on_miss="none"):
        enough = (r["ssd_bytes"] or 0) >= (r["dataset_bytes"] or 0)
        out.append({"goal": "mixed SSD-on get-only: 0 misses and 0 dropped persists (SSD >= dataset)", "payload": r["payload_bytes"],
                    "concurrency": r["concurrency"], "mode": r["mode"],
                    "value": {"misses": r["misses"], "errors": r["errors"], "dropped_persists": r["dropped_persists"], "ssd_ge_dataset": enough},
                    "met": enough and r["misses"] == 0 and not r["errors"] and r["dropped_persists"] == 0})
    for r in pick(backend="mooncake"):
        same = dict(ssd=r["ssd"]) if r["path"] == "mixed" else {}
        mine = pick(backend="fluxkv", path=r["path"], on_miss=r["on_miss"], mode=r["mode"], payload_bytes=r["payload_bytes"],
                    concurrency=r["concurrency"], **same)
        if mine and r["hit_gib_s"]:
            x = mine[0]["hit_gib_s"] / r["hit_gib_s"]
            out.append({"goal": "fluxkv >= 2x Mooncake", "path": r["path"], "ssd": r["ssd"], "payload": r["payload_bytes"], "concurrency": r["concurrency"],
                        "mode": r["mode"], "mooncake_variant": r.get("variant"), "value": x,
                        "met": x >= 2.0 and not mine[0]["errors"] and (mine[0]["hit_rate"] or 0) >= (r["hit_rate"] or 0)})
    return out


# -- output ----------------------------------------------------------------------------------------


def series_name(r: dict) -> str:
    if r["backend"] == "tcp-raw":
        return "tcp-raw"
    name = f"{r['backend']} {r['path']}"
    if r["path"] == "mixed":
        name += f" ssd {'on' if r['ssd'] else 'off'}" + (" read-thr" if r["on_miss"] == "put" else "")
    return f"{name} {r['mode']}"


def _f(v, fmt: str, width: int) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:{width}{fmt}}"


TABLE_HEAD = (f"{'row':<40} {'payload':<10} {'cN':<4} {'GiB/s':>7} {'x tcp':>6} {'x lSSD':>6} {'hits':>7} {'miss':>6} {'err':>4} {'hit%':>6} "
              f"{'mem-l':>6} {'mem-r':>6} {'ssd-l':>6} {'ssd-r':>6} {'p50us':>7} {'p99us':>7} {'drop':>4} {'vals':>5} {'dupMiB':>6}")


def fmt_row(r: dict) -> str:
    head = f"{series_name(r):<40} {format_size(r['payload_bytes']):<10} {r['concurrency']:<4}"
    if r["status"] in ("unavailable", "failed"):
        return f"{head} {r['status'].upper()}: {r['reason']}"
    hr = None if r["hit_rate"] is None else r["hit_rate"] * 100
    return (f"{head} {_f(r['hit_gib_s'], '.3f', 7)} {_f(r.get('x_tcp_raw'), '.2f', 6)} {_f(r.get('x_local_ssd'), '.2f', 6)} "
            f"{_f(r['hits'], 'd', 7)} {_f(r['misses'], 'd', 6)} {_f(r['errors'], 'd', 4)} {_f(hr, '.1f', 6)} "
            + " ".join(_f(r.get(f"{p}_hits"), "d", 6) for p in PLACES)
            + f" {_f(r['p50_us'], '.0f', 7)} {_f(r['p99_us'], '.0f', 7)} {_f(r.get('dropped_persists'), 'd', 4)}"
            + f" {_f(r.get('distinct_values'), 'd', 5)} {_f(None if r.get('duplicate_bytes') is None else r['duplicate_bytes'] / 2**20, '.0f', 6)}"
            + ("" if r["status"] == "ok" else f" {r['status'].upper()}")
            + ("" if r.get("one_process_gib_s") is None else f"  (one process: {r['one_process_gib_s']:.3f})"))


def print_table(records: list[dict], stream=sys.stdout) -> None:
    print(TABLE_HEAD, file=stream)
    for r in records:
        print(fmt_row(r), file=stream)


def print_goals(gs: list[dict], stream=sys.stdout) -> None:
    if not gs:
        return
    print("\ngoals (issue 14 item 4):", file=stream)
    for g in gs:
        v = g["value"]
        v = f"{v:.2f}x" if isinstance(v, float) else json.dumps(v)
        state = "n/a    " if g["met"] is None else "MET    " if g["met"] else "NOT MET"
        where = f"{label_size(g['payload'])} {g.get('concurrency', '')} {g.get('mode', '')}" + (f" {g['path']}" if g.get("path") else "")
        print(f"  {state} {g['goal']:<70} {where:<32} {v}", file=stream)


# -- a run -----------------------------------------------------------------------------------------


def run(opts) -> list[dict]:
    out_dir = Path(opts.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = harness.Context(opts)
    for p in opts.pythonpath:
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    cases = cases_for(opts)
    t0 = T0[0] = clock()
    print(
        f"cluster: {len(cases)} cases; {opts.owners} owners x {format_size(opts.owner_dram)} DRAM, SSD on {opts.ssd_owners} "
        f"({format_size(opts.ssd_size)} each), dataset {opts.dataset_ratio:g} x DRAM (remote-memory {opts.remote_memory_ratio:g} x one owner), "
        f"warmup {opts.warmup:g} s, window {opts.window:g} s, work dir {opts.work_dir} ({fs_type(opts.work_dir)}); "
        f"host {platform.node()} with {os.cpu_count()} CPUs",
        file=sys.stderr,
    )
    records: list[dict] = []
    scratch = Group()
    try:
        binary, why = (None, None)
        if opts.tcp_raw:
            binary, why = remoteget_binary(opts, scratch.mkdtemp(opts.work_dir, "fkc-remoteget-"))
            if why:
                print(f"tcp-raw: SKIPPED: {why}", file=sys.stderr)
        summary = out_dir / "summary.jsonl"
        with open(summary, "w") as f:  # as each case ends (kept if the run is interrupted) ...
            for i, case in enumerate(cases, 1):
                print(f"[{i}/{len(cases)} {clock() - t0:6.1f}s] {case.label()}", file=sys.stderr, flush=True)
                t1 = clock()
                load0 = round(os.getloadavg()[0], 2)
                if isinstance(case, TcpRaw):
                    recs = [run_tcp_raw(case.payload_bytes, case.procs, case.threads, ctx, binary, why)]
                elif case.backend == "mooncake":
                    recs = [run_mooncake(case, ctx)]
                else:
                    recs = run_fluxkv(case, ctx)
                for rec in recs:
                    rec["case_seconds"] = round(clock() - t1, 1)
                    rec["load_avg"] = [load0, round(os.getloadavg()[0], 2)]
                if isinstance(case, TcpRaw) and case.again:
                    first = next((r for r in records if r["backend"] == "tcp-raw" and r["payload_bytes"] == case.payload_bytes
                                  and r["concurrency"] == recs[0]["concurrency"]), None)
                    if first is not None:
                        merge_tcp_raw(first, recs[0])
                        recs = [first]
                    else:
                        records += recs
                else:
                    records += recs
                add_ratios(records)
                for rec in recs:
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    print("    " + fmt_row(rec), file=sys.stderr, flush=True)
        tmp = summary.with_suffix(".tmp")  # ... then once more in order, with the final tcp-raw rows and ratios
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.replace(tmp, summary)
    finally:
        scratch.close()
    print(f"cluster: {len(records)} rows in {clock() - t0:.1f} s", file=sys.stderr)
    return records


def finish(records: list[dict], opts, interrupted: bool = False) -> None:
    """The table, the goals (also DIR/goals.json) and DIR/cluster.png."""
    out_dir = Path(opts.out)
    print()
    print_table(records)
    gs = goals(records)
    print_goals(gs)
    (out_dir / "goals.json").write_text(json.dumps(gs, indent=1) + "\n")
    if not opts.no_chart:
        try:
            from .chart import render_cluster

            png = render_cluster(records, out_dir / "cluster.png", f"fluxkv cluster benchmark ({opts.preset}{', interrupted' if interrupted else ''})")
            print(f"\nwrote {out_dir / 'summary.jsonl'}, {out_dir / 'goals.json'} and {png}")
        except ImportError as e:
            print(f"chart skipped: {e} (apt-get install python3-matplotlib)", file=sys.stderr)


# -- command line ----------------------------------------------------------------------------------

PRESETS = {
    # Under 4 minutes on 2 cores: 3 owners of 128 MiB, one with SSD, 1 and 16 MiB - 128 B, c2 (2 processes on 2 owners).
    # mixed in bytes mode (as bench-quick), the remote paths in holder mode: the bytes land in the reader's owner and the
    # client gets a zero-copy view, the same data movement as tcp-raw's receive into a buffer (no Python copy on top).
    "quick": dict(owners=3, ssd_owners=1, owner_dram="128MiB", payloads="1MiB-128,16MiB-128", workers="c2",
                  modes={"mixed": "bytes", "remote-memory": "holder", "remote-ssd": "holder"},
                  warmup=1.0, window=3.0, mixed_kinds=[(False, "none"), (True, "none"), (False, "put")]),
    # The seed's sizes per owner: 2 GiB DRAM, payloads 1/4/8/16 MiB - 128 B, c2 … c16, SSD off/on x get-only/read-through.
    "full": dict(owners=3, ssd_owners=1, owner_dram="2GiB", payloads="1MiB-128,4MiB-128,8MiB-128,16MiB-128", workers="c2,c4,c8,c16",
                 modes={p: "holder,bytes" for p in PATHS}, warmup=5.0, window=30.0, mixed_kinds=None),
}
SSD_PER_DRAM = 8  # the seed's 16 GiB SSD for 2 GiB DRAM, here for the cluster's DRAM


def add_arguments(r: argparse.ArgumentParser) -> None:
    """The ``cluster`` subcommand's flags (the harness's shared ones come from cli)."""
    from . import cli

    r.add_argument("--out", required=True, help="output directory (summary.jsonl, goals.json, cluster.png)")
    r.add_argument("--preset", choices=sorted(PRESETS), default="quick", help="default sizes and matrix (default quick)")
    g = r.add_argument_group("cluster and sizes")
    g.add_argument("--owners", type=int, help="owners (default 3)")
    g.add_argument("--ssd-owners", type=int, help="how many owners (the first ones) have SSD (default 1)")
    g.add_argument("--owner-dram", help="DRAM per owner (quick 128MiB, full 2GiB)")
    g.add_argument("--ssd-size", help=f"SSD ring per SSD owner (default {SSD_PER_DRAM} x the cluster's DRAM / SSD owners)")
    g.add_argument("--dataset-ratio", type=float, default=1.25, help="mixed and remote-ssd dataset / the cluster's DRAM (default 1.25)")
    g.add_argument("--remote-memory-ratio", type=float, default=0.75, help="remote-memory dataset / one owner's DRAM: it must fit one owner (default 0.75)")
    g.add_argument("--filler-ratio", type=float, default=1.25, help="remote-ssd filler / the cluster's DRAM: pushes the dataset out of memory (default 1.25)")
    m = r.add_argument_group("matrix")
    m.add_argument("--backends", default="fluxkv,mooncake", help="fluxkv and/or mooncake (its dedicated_owner topology, where installed)")
    m.add_argument("--paths", default=",".join(PATHS), help=f"comma list of {', '.join(PATHS)} (remote-ssd brings its local-ssd reference)")
    m.add_argument("--payloads", help="payload sizes (quick: 1MiB-128,16MiB-128; full: the seed's four)")
    m.add_argument("--workers", help=f"layouts: {', '.join(f'{k}={p}x{t}' for k, (p, t) in CLUSTER_WORKERS.items())} or PROCSxTHREADS; "
                   "process i is attached to an owner of the path in turn")
    m.add_argument("--modes", help="output modes of every path: holder, bytes (quick: mixed bytes, remote paths holder; full: both)")
    m.add_argument("--ssd", help="mixed path SSD states: off,on (quick: get-only off and on, read-through off)")
    m.add_argument("--on-miss", help="mixed path window kinds: none, put")
    m.add_argument("--bootstrap-order", default="random", help="random, hot-first or cold-first")
    m.add_argument("--no-tcp-raw", dest="tcp_raw", action="store_false", help="skip the tcp-raw rows")
    cli.add_workload_arguments(r.add_argument_group("timing and workload"), "quick: 1, full: 5", "quick: 3, full: 30")
    for name in ("fluxkv", "mooncake"):
        cli.add_backend_arguments(r, name)
    f = r.add_argument_group("cluster tools")
    f.add_argument("--fluxkv-master-args", default="", help="extra flags for 'fluxkv master' (recorded in server.cmd)")
    f.add_argument("--fluxkv-owner-args", default="", help="extra flags for every 'fluxkv owner'")
    f.add_argument("--fluxkv-landing", default="auto",
                   help="mixed path: every owner's --landing-reserve, memory beyond its DRAM for gets of values other owners hold "
                        "(as a Mooncake client's local buffer): a size, 0 for none, or auto (default: twice the payload of the gets "
                        "in flight through one owner)")
    f.add_argument("--remoteget-bin", default=str(REPO / "bin" / "fluxkv-remoteget"),
                   help="bench/remoteget binary for the tcp-raw rows (make bench-cluster builds it; else built here with --go)")
    f.add_argument("--go", default="go", help="go tool that builds bench/remoteget when --remoteget-bin is missing")
    cli.add_tool_arguments(r.add_argument_group("tools"))


def resolve(a) -> argparse.Namespace:
    from . import cli
    from .sizes import parse_size

    p = PRESETS[a.preset]
    if a.fluxkv_landing not in ("auto", "0", "off"):
        try:
            parse_size(a.fluxkv_landing)
        except ValueError as e:
            raise SystemExit(f"--fluxkv-landing {a.fluxkv_landing!r}: want a size, 0 or auto ({e})") from None

    def pick(name, key=None):
        v = getattr(a, name)
        return p[key or name] if v is None else v

    a.owners = int(pick("owners"))
    a.ssd_owners = int(pick("ssd_owners"))
    if a.owners < 1 or not 0 <= a.ssd_owners <= a.owners:
        raise SystemExit("--owners must be >= 1 and --ssd-owners between 0 and --owners")
    a.owner_dram = parse_size(pick("owner_dram"))
    a.ssd_size = parse_size(a.ssd_size) if a.ssd_size else (SSD_PER_DRAM * a.owners * a.owner_dram // max(1, a.ssd_owners))
    a.payload_list = [parse_size(x) for x in cli.csv(pick("payloads"))]
    a.worker_list = [parse_cluster_workers(x) for x in cli.csv(pick("workers"))]
    a.path_modes = {p: cli.csv(a.modes) for p in PATHS} if a.modes else {p: cli.csv(m) for p, m in PRESETS[a.preset]["modes"].items()}
    a.mode_list = sorted({m for ms in a.path_modes.values() for m in ms})
    a.mixed_kinds = None
    if a.ssd is None and a.on_miss is None and p["mixed_kinds"] is not None:
        a.mixed_kinds = list(p["mixed_kinds"])
    a.ssd_list = cli.onoff(a.ssd or "off,on")
    a.on_miss_list = cli.csv(a.on_miss or "none,put")
    a.path_list = cli.csv(a.paths)
    a.backend_list = cli.csv(a.backends)
    a.warmup = float(pick("warmup"))
    a.window = float(pick("window"))
    a.pythonpath = [Path(x).resolve() for x in a.pythonpath]
    # what the pressure harness's shared code reads (Mooncake rows, worker configs)
    a.dram, a.dataset = a.owner_dram, int(a.dataset_ratio * a.owners * a.owner_dram)
    if a.fluxkv_up_args:
        raise SystemExit("--fluxkv-up-args is for 'fluxkv up' (python3 -m pressure run); here: --fluxkv-master-args, --fluxkv-owner-args")
    for x in a.mode_list:
        if x not in ("holder", "bytes"):
            raise SystemExit(f"--modes: {x!r}: the cluster benchmark runs holder and bytes")
    for x in a.path_list:
        if x not in PATHS:
            raise SystemExit(f"--paths: {x!r} not in {PATHS}")
    for x in a.backend_list:
        if x not in ("fluxkv", "mooncake"):
            raise SystemExit(f"--backends: {x!r}: fluxkv, mooncake")
    for x in a.on_miss_list:
        if x not in ("none", "put"):
            raise SystemExit(f"--on-miss: {x!r}: none, put")
    return harness.check_window_and_workdir(a)


def main(a) -> int:
    from .procs import install_signal_handlers

    opts = resolve(a)
    install_signal_handlers()
    t0 = clock()
    records, interrupted = harness.run_keeping_partial(lambda: run(opts), opts.out)
    if records:
        finish(records, opts, interrupted)
    print(f"wall time {clock() - t0:.1f} s", file=sys.stderr)
    return 130 if interrupted else 0
