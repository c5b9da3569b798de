"""Helpers shared by the studies: config, devices, seeding, batching, atomic output, CLI."""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from mwm.config import ConfigError, config_hash, load_config
from mwm.config import resolve_device as _resolve_device
from mwm.io import atomic_write_text  # the package's one atomic writer (umask-honouring)
from mwm.optim.manifolds import Manifold, get_manifold
from mwm.optim.msign import msign
from mwm.config.names import STUDY_MANIFOLDS
from mwm.paths import check_out_root

__all__ = [
    "rel_error",
    "variant_manifold",
    "resolve_device",
    "pair_seed",
    "random_pairs",
    "chunks",
    "write_csv",
    "write_json",
    "read_csv",
    "finite_or_none",
    "run_meta",
    "build_parser",
    "main_for",
]

def variant_manifold(variant: str) -> Manifold:
    """The :class:`Manifold` of a study manifold variant (``stiefel``, ``dgram-paper``, ...:
    :data:`mwm.config.names.STUDY_MANIFOLDS`)."""
    if variant not in STUDY_MANIFOLDS:
        raise ValueError(f"unknown manifold variant {variant!r}; choose one of {', '.join(STUDY_MANIFOLDS)}")
    return get_manifold(*STUDY_MANIFOLDS[variant])


def resolve_device(name: str) -> torch.device:
    """``studies.device`` as a torch device (:func:`mwm.config.resolve_device`)."""
    return _resolve_device(name, "studies.device")


def pair_seed(*parts: Any) -> int:
    """A 63-bit seed from a tuple of labels (stable across runs and platforms)."""
    blob = "|".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") & ((1 << 63) - 1)


def rel_error(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """``||X||_F / ||Y||_F`` per matrix (float64): the studies' relative error of a matrix to its reference."""
    num = X.double().square().sum(dim=(-2, -1)).sqrt()
    den = Y.double().square().sum(dim=(-2, -1)).sqrt()
    return num / den


def random_pairs(study: str, variant: str, n: int, seeds: int, base_seed: int,
                 stiefel_init: str = "msign", m: int | None = None, precision: str = "float32"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``seeds`` random ``(W, G)`` pairs of shape ``m x n`` (``m`` defaults to ``n``), float32, CPU.

    ``G`` is standard Gaussian. ``W`` is a Gaussian matrix divided by ``sqrt(m)`` (so
    its Frobenius norm is about ``sqrt(n)``, that of a Stiefel point, whatever the
    manifold) and put on the manifold: Stiefel by Polar Express (``msign``, the
    paper's stated init) or the exact polar factor (``exact``); DGram and Oblique by
    their retraction. Seed ``s`` of size ``n`` draws the same Gaussian matrices for
    every variant, so variants are compared on the same draws. ``precision`` is the
    msign precision of the Stiefel ``msign`` init (the study's protocol).
    """
    m = n if m is None else m
    if stiefel_init not in ("msign", "exact"):
        raise ValueError(f"unknown stiefel_init {stiefel_init!r}; choose msign or exact")
    mf = variant_manifold(variant)
    Ws, Gs = [], []
    for s in range(seeds):
        g = torch.Generator().manual_seed(pair_seed(study, m, n, s, base_seed))
        Ws.append(torch.randn(m, n, generator=g) / math.sqrt(m))
        Gs.append(torch.randn(m, n, generator=g))
    X, G = torch.stack(Ws), torch.stack(Gs)
    if mf.name == "stiefel":
        W = msign(X, precision=precision) if stiefel_init == "msign" else mf.init(X)
    else:
        W = mf.init(X)
    return W.contiguous(), G.contiguous()


def chunks(total: int, per_item_elements: int, max_elements: int) -> list[slice]:
    """Slices cutting ``total`` items into chunks of at most ``max_elements`` entries."""
    size = max(1, max_elements // max(1, per_item_elements))
    return [slice(i, min(i + size, total)) for i in range(0, total, size)]


# -- output ---------------------------------------------------------------------------

def _fmt(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v).lower()
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    return v


def write_csv(path: str | Path, columns: Sequence[str], rows: Iterable[Sequence[Any] | dict]) -> Path:
    """Atomically write a tidy CSV (header ``columns``; rows as sequences or dicts).

    Floats are written with full precision (``repr``), booleans as ``true``/``false``,
    ``None`` as an empty field.
    """
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        if isinstance(row, dict):
            row = [row.get(c) for c in columns]
        if len(row) != len(columns):
            raise ValueError(f"{path}: row of {len(row)} fields for {len(columns)} columns")
        w.writerow([_fmt(v) for v in row])
    return atomic_write_text(path, buf.getvalue())


def finite_or_none(x: Any) -> Any:
    """JSON-safe number: NaN/Inf become ``None``; numpy/torch scalars become floats."""
    if x is None or isinstance(x, (bool, int, str)):
        return x
    try:
        f = float(x)
    except (TypeError, ValueError):
        return x
    return f if math.isfinite(f) else None


def _json_clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_clean(v) for v in obj]
    if isinstance(obj, float):
        return finite_or_none(obj)
    if isinstance(obj, torch.Tensor) and obj.numel() == 1:
        return finite_or_none(obj.item())
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return _json_clean(obj.item())
    return obj


def write_json(path: str | Path, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON (NaN/Inf written as null)."""
    return atomic_write_text(path, json.dumps(_json_clean(obj), indent=2, sort_keys=False) + "\n")


def read_csv(path: str | Path) -> list[dict[str, str]]:
    """Rows of a CSV as dicts of strings."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def run_meta(section: dict, device: torch.device, wall_s: float, config_path: str | None,
             precisions: Sequence[str] = ("float32",)) -> dict:
    """Provenance block written into every derived JSON."""
    from mwm.numerics import VERSION

    return {
        "config": config_path,
        "numerics": VERSION,
        "section_hash": config_hash(section),
        "wall_seconds": round(wall_s, 3),
        "device": str(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "dtype": "float32",
        "msign_precisions": list(precisions),
        "faithful_precision": precisions[0],
    }


# -- command line -----------------------------------------------------------------------

def build_parser(prog: str, description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
                 ) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=description,
        epilog="Overrides are dotted.key=value with YAML values, e.g. studies.alpha.sizes=[16,32] "
               "studies.alpha.seeds=2. Outputs are written atomically under --out.")
    p.add_argument("--config", required=True, help="config YAML (validated against src/mwm/config/schema/*.yaml)")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    if extra is not None:
        extra(p)
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    return p


def main_for(prog: str, description: str, run: Callable[..., dict],
             extra: Callable[[argparse.ArgumentParser], None] | None = None,
             extra_kwargs: Callable[[argparse.Namespace], dict] | None = None,
             argv: Sequence[str] | None = None) -> int:
    """Shared ``main``: parse, load and validate the config, run, print a one-line summary."""
    args = build_parser(prog, description, extra).parse_args(argv)
    try:
        check_out_root(args.out)
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    kwargs = extra_kwargs(args) if extra_kwargs else {}
    if cfg["studies"].get("threads"):
        torch.set_num_threads(cfg["studies"]["threads"])
    t0 = time.perf_counter()
    try:
        derived = run(cfg, args.out, config_path=str(args.config), **kwargs)
    except (ConfigError, ValueError, FileNotFoundError, KeyError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(f"{prog}: wrote {args.out} in {time.perf_counter() - t0:.1f} s "
          f"({derived.get('meta', {}).get('device', '?')})")
    return 0


if __name__ == "__main__":  # a library: say which modules are the studies' entry points
    print("mwm.studies.common holds what the studies share; run a study: python -m mwm.studies.{alpha,absorption,"
          "audits,solvers} --config FILE --out DIR (--help for each)", file=sys.stderr)
    sys.exit(2)
