"""``prepare``: a corpus to ``train.bin``, ``val.bin`` and ``meta.json``, atomically.

Everything is written into a temporary folder inside the output folder and moved
into place (``os.replace``) only once every check has passed, bins first and
``meta.json`` last; on any error the existing outputs are left as they were. Before
any work the output folder is checked: one that holds bins made with another
tokenizer or vocabulary (or bins without a ``meta.json``) is refused unless
``force`` is given.

The temporary folder is named ``.prepare-<host>-<pid>-<start>-<random>`` (``start``:
the process's start time, so a reused pid is told apart). A killed ``prepare``
leaves its folder behind (for OpenWebText ~40 GB of text store); the next
``prepare`` into the same output folder removes those of dead processes on this
host, and names (but keeps) any of another host or an unknown layout.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from mwm import __version__
from mwm.config import config_hash
from mwm.data import vocab as vocab_mod
from mwm.data.corpora import UNIT_CHARS, Source, make_source
from mwm.data.encode import DTYPE, encode_units
from mwm.errors import DataError
from mwm.data.reader import FORMAT, FORMAT_VERSION, SPLITS, meta_digest, sha256_file
from mwm.data.spec import content, dataset_dir, normalize
from mwm.data.tokenizer import tokenizer_info

__all__ = ["prepare", "check_out_dir", "remove_stale_work"]

#: prefix of prepare's temporary folder inside the output folder
WORK_PREFIX = ".prepare-"


def _stderr(msg: str) -> None:
    print(f"mwm.data: {msg}", file=sys.stderr, flush=True)


def _usable_cpus() -> int:
    """CPUs this process may run on (affinity / cgroup-aware where the platform says)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _work_prefix() -> str:
    from mwm.lock import proc_start

    pid = os.getpid()
    return f"{WORK_PREFIX}{socket.gethostname()}-{pid}-{proc_start(pid) or 0}-"


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def remove_stale_work(out: Path, log: Callable[[str], None]) -> list[Path]:
    """Remove the temporary folders in ``out`` of ``prepare`` processes of this host that
    are gone (killed: nothing removed them); returns them. Folders of live processes,
    of other hosts and of an unknown name layout are kept (the last two named)."""
    from mwm.lock import pid_alive, proc_start

    host, removed = socket.gethostname(), []
    for d in sorted(out.glob(f"{WORK_PREFIX}*")):
        if not d.is_dir() or d.is_symlink():
            continue
        try:
            who, pid, start, _ = d.name[len(WORK_PREFIX):].rsplit("-", 3)
            pid = int(pid)
        except ValueError:
            log(f"note: {d} looks like a work folder of an older prepare; remove it by hand if no prepare runs")
            continue
        if who != host:
            log(f"note: {d} is a work folder of a prepare on host {who}; kept (remove it by hand if that one is gone)")
            continue
        if pid_alive(pid) and str(proc_start(pid) or 0) == start:
            continue  # a prepare running now
        size = _du(d)
        shutil.rmtree(d, ignore_errors=True)
        log(f"removed {d}, the work folder of a prepare (pid {pid}) that is gone ({size / 1e9:.2f} GB)")
        removed.append(d)
    return removed


def _identity(meta: dict) -> dict:
    tok = meta.get("tokenizer") or {}
    remap = meta.get("remap") or {}
    return {"tokenizer": tok.get("name"), "bpe_sha256": tok.get("bpe_sha256"),
            "vocab_size": meta.get("vocab_size"), "remap_k": remap.get("k")}


def _describe(ident: dict) -> str:
    k = ident["remap_k"]
    vocab = "the full vocabulary" if k is None else f"the remap to the top {k} ids + UNK"
    return f"tokenizer {ident['tokenizer']} with {vocab} (vocab_size {ident['vocab_size']})"


def check_out_dir(out: Path, identity: dict, force: bool) -> None:
    """Refuse an output folder holding bins of another tokenizer/vocabulary (unless ``force``)."""
    if out.exists() and not out.is_dir():
        raise DataError(f"output {out} exists and is not a folder")
    if force or not out.is_dir():
        return
    meta_path = out / "meta.json"
    bins = [p.name for p in (out / f"{s}.bin" for s in SPLITS) if p.exists()]
    if meta_path.exists():
        try:
            old = json.loads(meta_path.read_text())
            if not isinstance(old, dict):
                raise ValueError("not a mapping")
        except (OSError, ValueError) as exc:
            raise DataError(f"{meta_path} is unreadable ({exc}), so what made the bins in {out} is unknown; "
                            f"pass --force (force=True) to replace them") from exc
        old_id = _identity(old)
        if old_id != identity:
            raise DataError(f"{out} holds bins made with {_describe(old_id)}; this run makes "
                            f"{_describe(identity)}. Choose another output folder, or pass --force "
                            f"(force=True) to replace them")
    elif bins:
        raise DataError(f"{out} holds {', '.join(bins)} without a meta.json, so their tokenizer is unknown; "
                        f"choose another output folder, or pass --force (force=True) to replace them")


def _split_tail(tmp: Path, total: int, val_fraction: float) -> None:
    """``all.raw`` -> ``train.raw`` (head) + ``val.raw`` (last ceil(f x total) tokens)."""
    n_val = math.ceil(val_fraction * total)
    n_train = total - n_val
    if n_val < 1 or n_train < 1:
        raise DataError(f"split tail: {total} tokens leave {n_train} for train and {n_val} for val "
                        f"(val_fraction {val_fraction}); the corpus is too small")
    src = tmp / "all.raw"
    with open(src, "rb") as fin, open(tmp / "val.raw", "wb") as fout:
        fin.seek(n_train * DTYPE.itemsize)
        shutil.copyfileobj(fin, fout, 1 << 22)
    os.truncate(src, n_train * DTYPE.itemsize)
    os.replace(src, tmp / "train.raw")


def _count_eot(path: Path, eot: int) -> int:
    n = 0
    size = path.stat().st_size
    if size:
        mm = np.memmap(path, dtype=DTYPE, mode="r")
        for start in range(0, len(mm), vocab_mod.CHUNK_TOKENS):
            n += int(np.count_nonzero(mm[start:start + vocab_mod.CHUNK_TOKENS] == eot))
        del mm
    return n


def _expected(sec: dict, src: Source) -> dict:
    """The counts to check: ``data.expect``, or the source's published ones when null."""
    exp = sec.get("expect")
    return dict(src.reference_counts() or {}) if exp is None else dict(exp)


def _check_documents(expected: dict, src: Source) -> None:
    want = expected.get("documents")
    if want is not None and src.n_docs != want:
        raise DataError(f"corpus {src.name} has {src.n_docs:,} documents, expected exactly {want:,} "
                        f"(data.expect; null means the corpus's published count): a partial or different "
                        f"copy of the corpus. Nothing was written")


def _check_tokens(expected: dict, splits: dict, src: Source) -> dict | None:
    """Compare token counts with ``expected``; raise on a mismatch; the record for meta.json."""
    if not expected:
        return None
    got = {name: splits[name]["tokens"] for name in SPLITS}
    report = {**expected, "got": {"documents": src.n_docs, "train_tokens": got["train"],
                                  "val_tokens": got["val"]}}
    bad = []
    tr, va = expected.get("train_tokens"), expected.get("val_tokens")
    if tr is not None and va is not None:
        tol, total = expected.get("tolerance", 0.0), got["train"] + got["val"]
        if abs(total - (tr + va)) > tol * (tr + va):
            bad.append(f"train + val tokens {total:,}, expected {tr + va:,} within {tol:.2%}")
    elif tr is not None and abs(got["train"] - tr) > expected.get("tolerance", 0.0) * tr:
        bad.append(f"train tokens {got['train']:,}, expected {tr:,} within {expected.get('tolerance', 0.0):.2%}")
    if va is not None:
        vtol = expected.get("val_tolerance", 0.0)
        if abs(got["val"] - va) > vtol * va:
            bad.append(f"val tokens {got['val']:,}, expected {va:,} within {vtol:.2%}")
    if bad:
        raise DataError(f"corpus {src.name}: " + "; ".join(bad) + " (data.expect; null means the corpus's "
                        "published counts): the tokens are not the expected corpus. Nothing was written")
    return report


def _same_file(path: Path, sha256: str) -> bool:
    """Whether ``path`` exists and its content has this digest."""
    return path.is_file() and sha256_file(path) == sha256


def prepare(section: dict | None = None, out: str | Path | None = None, *, force: bool = False,
            num_proc: int | None = None, source: Source | None = None, unit_chars: int = UNIT_CHARS,
            log: Callable[[str], None] | None = _stderr) -> Path:
    """Tokenize the corpus of a ``data`` section into ``out`` (default :func:`dataset_dir`).

    ``num_proc`` overrides ``section['num_proc']`` (null: the CPUs this process may
    use); ``source`` replaces the section's corpus (benchmarks); ``unit_chars`` is
    the text per work unit. Returns the output folder.
    """
    log = log or (lambda msg: None)
    sec = normalize(section)
    shaping = content(sec)
    out = Path(out) if out is not None else dataset_dir(sec)
    nproc = int(num_proc or sec["num_proc"] or _usable_cpus())

    tok = tokenizer_info()
    vocab_mod.check_fits_uint16(tok["n_vocab"], f"tokenizer {tok['name']}")
    k = sec["vocab_size"]
    if k is not None:
        if k >= tok["n_vocab"]:
            raise DataError(f"data.vocab_size: K={k} is not below the tokenizer's {tok['n_vocab']} ids "
                            f"(null keeps the full vocabulary)")
        vocab_mod.check_fits_uint16(k + 1, "data.vocab_size")
    identity = {"tokenizer": tok["name"], "bpe_sha256": tok["bpe_sha256"],
                "vocab_size": tok["n_vocab"] if k is None else k + 1, "remap_k": k}
    check_out_dir(out, identity, force)

    src = source if source is not None else make_source(sec)
    t0 = time.perf_counter()
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_work(out, log)
    tmp = Path(tempfile.mkdtemp(prefix=_work_prefix(), dir=out))
    ok = False
    try:
        src.materialize(tmp, nproc, log)
        expected = _expected(sec, src)
        _check_documents(expected, src)
        log(f"{src.name}: {src.n_docs} documents -> {out} ({nproc} worker{'s' * (nproc > 1)})")
        plan = src.plan(sec["split"], sec["val_fraction"], sec["seed"], unit_chars)
        names = [name for name, _ in plan]
        tokens = dict.fromkeys(names, 0)
        docs = dict.fromkeys(names, 0)
        handles = {name: open(tmp / f"{name}.raw", "wb") for name in names}
        try:
            last = t0
            units = itertools.chain.from_iterable(u for _, u in plan)
            for split, arr, n_docs in encode_units(units, nproc, src.worker_state):
                handles[split].write(arr.tobytes())
                tokens[split] += len(arr)
                docs[split] += n_docs
                now = time.perf_counter()
                if now - last > 30:
                    last = now
                    done = sum(tokens.values())
                    log(f"  {done:,} tokens, {sum(docs.values()):,} documents ({done / (now - t0):,.0f} tokens/s)")
        finally:
            for fh in handles.values():
                fh.close()
        total, total_docs = sum(tokens.values()), sum(docs.values())
        if total - total_docs <= 0:
            raise DataError(f"the corpus is empty: {src.name} gave {total_docs} documents and no text")
        eot = tok["eot"]
        if sec["split"] == "tail":
            _split_tail(tmp, total, sec["val_fraction"])
            val_docs = _count_eot(tmp / "val.raw", eot)
            docs = {"train": total_docs - val_docs, "val": val_docs}
        splits = {}
        for name in SPLITS:
            raw = tmp / f"{name}.raw"
            n = raw.stat().st_size // DTYPE.itemsize
            if n == 0:
                raise DataError(f"split {name} came out empty (corpus {src.name}, {src.n_docs} documents)")
            splits[name] = {"file": f"{name}.bin", "tokens": n, "bytes": n * DTYPE.itemsize,
                            "documents": docs[name]}
        checked = _check_tokens(expected, splits, src)

        remap = None
        if k is None:
            vocab_size, eot_id = tok["n_vocab"], eot
            for name in SPLITS:
                os.replace(tmp / f"{name}.raw", tmp / f"{name}.bin")
                splits[name]["sha256"] = sha256_file(tmp / f"{name}.bin")
        else:
            counts = vocab_mod.count_ids(tmp / "train.raw", tok["n_vocab"], DTYPE)
            kept = vocab_mod.choose_kept(counts, k, eot)
            table = vocab_mod.lookup_table(kept, tok["n_vocab"], DTYPE)
            vocab_size, eot_id = k + 1, int(table[eot])
            unk = {}
            for name in SPLITS:
                unk[name], splits[name]["sha256"] = vocab_mod.remap_file(
                    tmp / f"{name}.raw", tmp / f"{name}.bin", table, k)
                os.unlink(tmp / f"{name}.raw")
            remap = {
                "k": k, "unk_id": k, "rule": "the K most frequent ids of train.bin (ties: smaller id), "
                "end-of-text always kept; new ids 0..K-1 in GPT-2 id order; all others -> unk_id",
                "unk_tokens": unk,
                "unk_share": {name: round(unk[name] / splits[name]["tokens"], 8) for name in SPLITS},
                "kept_ids": [int(i) for i in kept],
            }
            log(f"  vocab remap: top {k} ids + UNK; UNK share train {remap['unk_share']['train']:.4%}, "
                f"val {remap['unk_share']['val']:.4%}")

        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "dtype": DTYPE.str,
            "vocab_size": vocab_size,
            "eot_id": eot_id,
            "tokenizer": tok,
            "remap": remap,
            "split": {"method": sec["split"], "val_fraction": sec["val_fraction"], "seed": sec["seed"]},
            "splits": splits,
            "corpus": src.info(),
            "expected": checked,
            "data": shaping,
            "data_hash": config_hash(shaping),
            "producer": f"mwm {__version__} (python -m mwm.data prepare)",
        }
        meta["meta_sha256"] = meta_digest(meta)  # meta.json checks itself (reader.read_meta)
        text = json.dumps(meta, indent=1)
        if remap is not None:  # the kept ids on one line, not one per line
            text = text.replace(json.dumps(remap["kept_ids"], indent=1).replace("\n", "\n  "),
                                json.dumps(remap["kept_ids"]), 1)
        (tmp / "meta.json").write_text(text + "\n")
        # a file whose bytes are already there stays as it is: a new mtime would make Snakemake plan
        # every run on this dataset again
        kept = [name for name in SPLITS if _same_file(out / f"{name}.bin", splits[name]["sha256"])]
        for name in SPLITS:
            if name not in kept:
                os.replace(tmp / f"{name}.bin", out / f"{name}.bin")
        if (out / "meta.json").is_file() and (out / "meta.json").read_bytes() == (tmp / "meta.json").read_bytes():
            kept.append("meta")
        else:
            os.replace(tmp / "meta.json", out / "meta.json")
        if len(kept) == len(SPLITS) + 1:
            log(f"  {out}: identical to what was there; its files are left untouched")
        ok = True
    finally:
        src.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if created and not ok:
            try:
                out.rmdir()  # only if still empty
            except OSError:
                pass
    dt = time.perf_counter() - t0
    log(f"wrote {out}: train {splits['train']['tokens']:,} tokens, val {splits['val']['tokens']:,} tokens, "
        f"vocab_size {vocab_size} ({dt:.1f} s, {total / max(dt, 1e-9):,.0f} tokens/s)")
    return out
