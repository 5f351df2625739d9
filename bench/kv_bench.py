#!/usr/bin/python3
"""KV pages through fluxkv.kv: time to first token with cached prefixes, and page copy speed.

Issue 27 item 6. One run starts a single-node cache (`fluxkv up`) and measures, each beside its
baseline in the same run:

  ttft        time to first token of tinylm.TinyLM (clients/python/tests/tinylm.py; --d-model,
              --layers, ...) for a --prompt-tokens prompt with 0 / 50 / 90 % (--cached) of its
              pages in fluxkv, against full recompute: contains_prefix + get_pages_into the
              model's preallocated host pool + prefill of the rest + the first greedy token.
              Configurations take turns within each of --runs rounds; medians are printed, with
              each one's lookup / load / prefill parts. The first token must equal the
              recompute's. Storing the new pages (done after the first token) is not counted.
              Goal: with 90 % cached, <= 0.3 of recompute.
  put/get     put_pages and get_pages_into of --batch pages of --page-size (bfloat16 tensors)
              against torch copy_ of the same tensors into preallocated buffers (pinned where
              this torch can pin, else plain), the three taking turns for --seconds; payload
              GiB/s. put_pages writes fresh pages every round (deleted after, untimed).
              Goal: get_pages_into >= 0.5 of memcpy.

Progress goes to stderr; figures and goals to stdout, and with --json one JSON document to a
file. Exit status 1 if a check failed (a page or first token that differs), else 0. The daemon
is stopped at the end, also on Ctrl-C or an error.

  make bench-kv
  /usr/bin/python3 bench/kv_bench.py --fluxkv-bin bin/fluxkv --prompt-tokens 8192 --runs 7 --json out/kv.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))  # tinylm
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

import fluxkv  # noqa: E402
from fluxkv import kv  # noqa: E402
from pressure.procs import Group, progress, run_group, install_signal_handlers, unix_socket_ready, wait_for  # noqa: E402
from pressure.sizes import format_size, parse_size  # noqa: E402
from tinylm import TinyLM, chain_hashes  # noqa: E402

GiB = 1 << 30
TTFT_GOAL = 0.3  # of recompute, with 90 % of the pages cached
GET_GOAL = 0.5  # of memcpy
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}



def host_buffers(n: int, shape: tuple, dtype: torch.dtype) -> tuple[list[torch.Tensor], bool]:
    """n preallocated buffers, pinned if this torch can pin host memory (it needs CUDA)."""
    try:
        return [torch.empty(shape, dtype=dtype, pin_memory=True) for _ in range(n)], True
    except RuntimeError:
        return [torch.empty(shape, dtype=dtype) for _ in range(n)], False


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# -- time to first token -----------------------------------------------------------------------------


class TTFTCase:
    """One configuration: ``cached`` leading pages of the prompt in fluxkv (None: recompute)."""

    def __init__(self, label: str, store: kv.PageStore | None, cached: int | None):
        self.label, self.store, self.cached = label, store, cached
        self.parts: dict[str, list[float]] = {"total": [], "lookup": [], "load": [], "prefill": []}


def first_token(m: TinyLM, prompt: torch.Tensor, hashes: list[str], case: TTFTCase, pool: list[torch.Tensor]) -> int:
    """One time to first token, its parts appended to case.parts (seconds)."""
    t0 = time.perf_counter()
    n = 0
    if case.store is not None:
        n = case.store.contains_prefix(hashes)
        if n != case.cached:
            raise RuntimeError(f"{case.label}: contains_prefix found {n} pages, {case.cached} were stored")
    t1 = time.perf_counter()
    if n and case.store.get_pages_into(hashes[:n], pool[:n]) != [True] * n:
        raise RuntimeError(f"{case.label}: a page found by contains_prefix was missing at the load")
    t2 = time.perf_counter()
    logits, _ = m.prefill(prompt, prefix_pages=pool[:n])
    token = int(torch.argmax(logits[-1]))
    t3 = time.perf_counter()
    for part, dt in (("total", t3 - t0), ("lookup", t1 - t0), ("load", t2 - t1), ("prefill", t3 - t2)):
        case.parts[part].append(dt)
    return token


def ttft_rows(c: fluxkv.Client, args, failures: list[str]) -> list[dict]:
    dtype = DTYPES[args.dtype]
    m = TinyLM(dtype=dtype, seed=0, vocab=args.vocab, d_model=args.d_model, n_layers=args.layers,
               n_heads=args.heads, n_kv_heads=args.kv_heads)
    prompt = m.prompt(args.prompt_tokens, seed=1)
    hashes = chain_hashes(prompt, m.page_tokens)
    progress(f"ttft: TinyLM d_model {args.d_model}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, {args.dtype}; "
             f"{args.prompt_tokens} tokens = {len(hashes)} pages of {format_size(m.page_bytes)}; full prefill once for the pages")
    t = time.perf_counter()
    logits, pages = m.prefill(prompt)
    ref_token = int(torch.argmax(logits[-1]))
    progress(f"ttft: full prefill took {time.perf_counter() - t:.2f} s")
    # At least the prompt's last token is computed: it gives the first token's logits.
    most = (args.prompt_tokens - 1) // m.page_tokens
    cases = [TTFTCase("recompute", None, None)]
    for pct in args.cached:
        n = min(most, len(hashes) * pct // 100)
        ns = kv.namespace(f"tinylm-d{args.d_model}", dtype=args.dtype, layout="L2HTD", extra=f"cached{pct}")
        store = kv.PageStore(c, ns, layout="L2HTD")
        if n and store.put_pages(hashes[:n], pages[:n]) != [True] * n:
            raise RuntimeError(f"{pct} %: put_pages did not store every page")
        cases.append(TTFTCase(f"{pct}% cached", store, n))
    pool, pinned = host_buffers(max(1, most), m.page_shape, dtype)
    for r in range(args.runs):
        for case in cases:
            token = first_token(m, prompt, hashes, case, pool)
            if token != ref_token:
                failures.append(f"ttft {case.label}: first token {token}, recompute gives {ref_token}")
        progress(f"ttft: round {r + 1}/{args.runs}: " + ", ".join(f"{cs.label} {cs.parts['total'][-1] * 1e3:.0f} ms" for cs in cases))
    for case in cases[1:]:
        back = [torch.empty(m.page_shape, dtype=dtype) for _ in range(case.cached)]
        case.store.get_pages_into(hashes[: case.cached], back)
        if not all(same_bytes(a, b) for a, b in zip(back, pages)):
            failures.append(f"ttft {case.label}: a page read back differs from the one stored")
    base = statistics.median(cases[0].parts["total"])
    rows = []
    for case in cases:
        med = {k: statistics.median(v) * 1e3 for k, v in case.parts.items()}
        rows.append({"row": "ttft", "case": case.label, "cached_pages": case.cached or 0, "pages": len(hashes),
                     "ttft_ms": med["total"], "lookup_ms": med["lookup"], "load_ms": med["load"], "prefill_ms": med["prefill"],
                     "ratio": med["total"] / 1e3 / base, "runs": args.runs, "pinned_pool": pinned,
                     "ttft_samples_ms": [round(t * 1e3, 3) for t in case.parts["total"]]})
    return rows


# -- page copy speed ---------------------------------------------------------------------------------


def throughput_rows(c: fluxkv.Client, args, failures: list[str]) -> list[dict]:
    shape = (2, args.page_size // 4)  # bfloat16 K and V halves: page_size bytes
    if 4 * shape[1] != args.page_size:
        raise ValueError(f"--page-size {args.page_size} must be a multiple of 4 bytes")
    g = torch.Generator().manual_seed(3)
    src = [torch.randn(shape, generator=g).to(torch.bfloat16) for _ in range(args.batch)]
    dst, pinned = host_buffers(args.batch, shape, torch.bfloat16)
    store = kv.PageStore(c, kv.namespace("kv-bench", dtype="bfloat16", layout="KV"), layout="KV")
    get_hashes = [f"get{i}" for i in range(args.batch)]
    if store.put_pages(get_hashes, src) != [True] * args.batch:
        raise RuntimeError("put_pages did not store the pages to get")
    batch_bytes = args.batch * args.page_size
    progress(f"put/get: {args.batch} x {format_size(args.page_size)} pages ({format_size(batch_bytes)} a batch), "
             f"memcpy into {'pinned' if pinned else 'plain'} buffers; {args.seconds:g} s, taking turns")

    def memcpy():
        for d, s in zip(dst, src):
            d.copy_(s)

    def get():
        if store.get_pages_into(get_hashes, dst) != [True] * args.batch:
            raise RuntimeError("get_pages_into missed a stored page")

    rounds = [0]

    def put():
        hs = [f"put{rounds[0]}-{i}" for i in range(args.batch)]
        t = time.perf_counter()
        ok = store.put_pages(hs, src)
        dt = time.perf_counter() - t
        if ok != [True] * args.batch:
            raise RuntimeError("put_pages of fresh pages did not store them all")
        store.delete_pages(hs)
        rounds[0] += 1
        return dt

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    for fn in (memcpy, get, put):  # warm
        fn()
    spent = {"memcpy": 0.0, "get_pages_into": 0.0, "put_pages": 0.0}
    n = 0
    deadline = time.perf_counter() + args.seconds
    while n < 3 or time.perf_counter() < deadline:
        spent["memcpy"] += timed(memcpy)
        spent["get_pages_into"] += timed(get)
        spent["put_pages"] += put()
        n += 1
    get()
    if not all(same_bytes(a, b) for a, b in zip(dst, src)):
        failures.append("get_pages_into: a page read back differs from the one stored")
    rate = {k: n * batch_bytes / v / GiB for k, v in spent.items()}
    rows = []
    for op in ("put_pages", "get_pages_into"):
        rows.append({"row": op, "gib_per_s": rate[op], "memcpy_gib_per_s": rate["memcpy"], "ratio": rate[op] / rate["memcpy"],
                     "page_size": args.page_size, "batch": args.batch, "batches": n, "pinned": pinned})
    return rows


# -- main ----------------------------------------------------------------------------------------------


def percentages(text: str) -> list[int]:
    out = [int(p) for p in text.split(",")]
    if any(p < 0 or p > 100 for p in out):
        raise argparse.ArgumentTypeError(f"--cached {text!r}: percentages 0..100")
    return out


def report(rows: list[dict], args) -> None:
    print(f"\nKV pages (issue 27): fluxkv up --dram {format_size(args.dram)}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    ttft = [r for r in rows if r["row"] == "ttft"]
    if ttft:
        print(f"  time to first token, {args.prompt_tokens} tokens ({ttft[0]['pages']} pages), TinyLM d_model {args.d_model} x {args.layers} layers, {args.dtype}, median of {args.runs}:")
        for r in ttft:
            goal = f"   goal <= {TTFT_GOAL} ({'met' if r['ratio'] <= TTFT_GOAL else 'MISSED'})" if r["case"] == "90% cached" else ""
            spread = f"{min(r['ttft_samples_ms']):.0f}..{max(r['ttft_samples_ms']):.0f}"
            print(f"    {r['case']:<12} {r['ttft_ms']:8.1f} ms ({spread:>11})  ratio {r['ratio']:5.3f}   lookup {r['lookup_ms']:6.2f}  "
                  f"load {r['load_ms']:7.2f}  prefill {r['prefill_ms']:8.1f} ms{goal}")
    for r in rows:
        if r["row"] in ("put_pages", "get_pages_into"):
            goal = f"   goal >= {GET_GOAL} ({'met' if r['ratio'] >= GET_GOAL else 'MISSED'})" if r["row"] == "get_pages_into" else ""
            print(f"  {r['row']:<15} {r['batch']} x {format_size(r['page_size'])}: {r['gib_per_s']:6.2f} GiB/s   memcpy "
                  f"{r['memcpy_gib_per_s']:6.2f} GiB/s ({'pinned' if r['pinned'] else 'plain'})   ratio {r['ratio']:5.3f}{goal}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--fluxkv-bin", default=str(REPO / "bin" / "fluxkv"), help="fluxkv binary (default bin/fluxkv: `make build`)")
    ap.add_argument("--dram", type=parse_size, default=parse_size("512MiB"), help="the node's DRAM")
    ap.add_argument("--work-dir", default=None, help="where the temp dir (socket, log) goes")
    ap.add_argument("--prompt-tokens", type=int, default=4096, help="prompt length for the ttft rows")
    ap.add_argument("--cached", type=percentages, default=[0, 50, 90], help="cached fractions of the prompt's pages, in percent")
    ap.add_argument("--runs", type=int, default=5, help="rounds of the ttft configurations (medians)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="model and KV dtype (bfloat16 prefill is slow on CPUs without bf16 units)")
    ap.add_argument("--d-model", type=int, default=512, help="model width of the ttft model (the test suite's is 128)")
    ap.add_argument("--layers", type=int, default=4, help="transformer layers (every page holds all of them)")
    ap.add_argument("--heads", type=int, default=8, help="query heads")
    ap.add_argument("--kv-heads", type=int, default=2, help="KV heads (grouped-query attention: --heads is a multiple)")
    ap.add_argument("--vocab", type=int, default=512, help="vocabulary size")
    ap.add_argument("--page-size", type=parse_size, default=parse_size("256KiB"), help="page size of the put/get rows")
    ap.add_argument("--batch", type=int, default=64, help="pages per put_pages / get_pages_into call")
    ap.add_argument("--seconds", type=float, default=3.0, help="measured time of the put/get rows")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--skip", choices=["ttft", "copy"], action="append", default=[], help="leave out a part (repeatable)")
    ap.add_argument("--json", default=None, help="write the figures to this file as one JSON document")
    args = ap.parse_args()
    if not os.access(args.fluxkv_bin, os.X_OK):
        ap.error(f"{args.fluxkv_bin} is not executable: run `make build` or pass --fluxkv-bin")
    if args.runs < 1 or args.batch < 1 or args.prompt_tokens < 2:
        ap.error("--runs and --batch must be >= 1, --prompt-tokens >= 2")
    if args.threads:
        torch.set_num_threads(args.threads)
    install_signal_handlers()
    rows: list[dict] = []
    failures: list[str] = []
    def measure(g: Group) -> None:
        tmp = g.mkdtemp(args.work_dir, "fkv-kv-")
        node = tmp / "node"
        node.mkdir()
        sock = str(node / "fluxkv.sock")
        progress(f"starting fluxkv up --dram {format_size(args.dram)} in {node}")
        p = g.start("fluxkv", [args.fluxkv_bin, "--log-format", "text", "--log-level", "warn", "up", "--dir", node,
                               "--dram", str(args.dram)], tmp / "fluxkv.log")
        wait_for(lambda: unix_socket_ready(sock), 60, "the node's socket", p)
        with fluxkv.connect(sock) as c:
            if "ttft" not in args.skip:
                rows.extend(ttft_rows(c, args, failures))
            if "copy" not in args.skip:
                rows.extend(throughput_rows(c, args, failures))

    if not run_group(measure, failures, "daemon"):
        return 130

    report(rows, args)
    if args.json:
        doc = {"bench": "kv", "args": {k: v for k, v in vars(args).items() if k not in ("json", "fluxkv_bin", "work_dir")},
               "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows, "failures": failures,
               "goals": {"ttft_ratio_at_90": f"<= {TTFT_GOAL}", "get_pages_into_vs_memcpy": f">= {GET_GOAL}"}}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
