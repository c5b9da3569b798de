"""Train one GPT-2 run under one manifold assignment: the command line (``python -m mwm.train``).

    python -m mwm.train --config config/config.yaml --assignment hetero --seed 0 [key=value ...]

One run per call; its folder is ``results/runs/<config>/<variant>/seed<seed>/``
(see :mod:`mwm.plan.runs`). Files, appended as the run goes and safe to read meanwhile:

``metrics.csv``   step, train_loss, lr, muon_lr, step_time, tokens_per_s, optimizer_time, optimizer_share
``eval.csv``      step, train_loss, val_loss (fixed batches, the same for every run of a config)
``spectral.csv``  per evaluation and hidden matrix (and W_Q, W_K, W_V): see :mod:`mwm.train.diagnostics`
``spectra/step_NNNNNN.npz``  full singular spectra and column norms per matrix
``sequence/step_NNNNNN.npz``  with ``train.capture_sequence`` or a grid run the solver study captures
                              (``studies.solvers.source: grid``): (W, momentum direction) of
                  every Muon matrix at each step of the window, as ``pairs.npz``
``attention.csv`` per evaluation, layer and head, on a fixed probe batch
``solver.csv``    per evaluation and Stiefel or DGram matrix, how well the inner solve did at the
                  step after it, beside a converged solve of the same pair: see :mod:`mwm.optim.quality`
``summary.json``  status (completed / unstable / failed), final and best val loss,
                  onset step, mean step time, optimizer share, parameter count,
                  config hash, code version
``final.pt``      final model weights (when ``train.keep_final_checkpoint``)

Resume: a checkpoint (model, both optimizers, step, RNG and data-sampler state,
divergence state) is written atomically every ``checkpoint_interval`` steps
under ``results/checkpoints/...``; starting the same run again resumes from it
and truncates the logs to the checkpoint, so the result equals an uninterrupted
run. The copy of the logs beside the checkpoint is written first and the checkpoint, which records
what its logs hold, last; a checkpoint whose logs are not what it recorded (even from that copy) is
moved aside with them (``<checkpoint folder>.unusable``) and the run starts afresh. SIGTERM / SIGUSR1 (a scheduler's
warning) write a checkpoint and exit with status 75 (``EXIT_PREEMPTED``) for the
workflow to retry.

Multi-process: launched by ``torchrun``, gradients are averaged with DDP (nccl on
GPU, gloo on CPU) and the Muon matrix banks are sharded across ranks.

The loop itself is :mod:`mwm.train.loop`; this module routes a command line to it (overrides, the
results root of a hand run, the ranks) and turns what can go wrong into one line and an exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch

from mwm.config import ConfigError, load_config, seed_bound
from mwm.config.names import RETRACTIONS, parse_variant, uses_dgram, variant_name
from mwm.errors import write_failure
from mwm.io import atomic_write_json
from mwm.paths import check_out_root
from mwm.plan.checks import check_config, check_run
from mwm.plan.ranks import accum_per_rank, ranks_per_run
from mwm.plan.runs import (FINAL_STATUSES, HAND_FOLDER, RESULTS_ROOT, check_grid, config_dir, config_run_identity,
                           hand_root, identity_diff, identity_problem, run_config, run_identity)
from mwm.plan.variants import assignment_spec
from mwm.train.folder import RunFolder
from mwm.train.launch import launch, worker_exit, worker_started
from mwm.train.loop import Run
from mwm.workflow.owner import claim

__all__ = ["main", "train", "keep_foreign_run", "out_root"]


def keep_foreign_run(cfg: dict, assignment: str, seed: int, retraction: str, out_root: Path) -> dict | None:
    """Before a run writes its folder: a finished run there that is not this one (trained before the config
    was edited, or by other numerics) is moved to ``<out_root>/hand/foreign/`` with a record of why, as the
    workflow would set it aside, never written over. Returns that record (None: nothing was there to keep)."""
    from mwm.setaside import move_aside

    variant = variant_name(assignment, retraction, cfg["grid"].get("custom"))
    folder = RunFolder(out_root, cfg["name"], variant, seed)
    try:
        summary = json.loads((folder.dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None  # nothing finished there (a missing or cut run resumes or restarts as before)
    if not isinstance(summary, dict) or summary.get("status") not in FINAL_STATUSES:
        return None
    why = identity_problem(summary, run_identity(cfg, assignment, seed, retraction))
    if why is None:
        return None  # this run's own: rerunning it is the user's choice, as before
    record = move_aside(folder.dir, folder.ckpt_dir, out_root, cfg["name"], variant, seed, why,
                        "a hand run (python -m mwm.train)")
    print(f"mwm.train: {folder.dir} held a finished run that is not this one ({why}); moved it to "
          f"{record['moved_to']} rather than write over it", file=sys.stderr)
    return record


def train(cfg: dict, assignment: str, seed: int, retraction: str | None = None,
          out_root: str | Path = "results", data=None) -> int:
    """Run (or resume) one training run; returns the process exit status. ``data``: its token dataset
    (None: the config's prepared one, :func:`mwm.train.batches.resolve_data`)."""
    try:
        cfg = run_config(cfg, assignment)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    retraction = retraction or cfg["train"]["dgram_retraction"]
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    previous = {}  # the signal handlers the run replaces
    if world > 1:
        backend = "nccl" if torch.cuda.is_available() and cfg["train"]["device"] != "cpu" else "gloo"
        torch.distributed.init_process_group(backend=backend)
    try:
        if rank == 0:
            try:
                keep_foreign_run(cfg, assignment, seed, retraction, Path(out_root))
            except (ConfigError, OSError) as exc:  # a run being written, a full disk: nothing moved
                print(f"error: {exc}", file=sys.stderr)
                return 2
        try:
            run = Run(cfg, assignment, seed, retraction, Path(out_root), rank, world, data=data)
        except (ConfigError, ValueError) as exc:  # bad input: refuse before anything is written
            print(f"error: {exc}", file=sys.stderr)
            return 2

        def on_signal(signum, frame):
            if signum == signal.SIGINT and run.stop_flag:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now
            run.stop_flag = True
            run.log(f"received signal {signum}; will checkpoint after this step")

        # Ctrl-C checkpoints too; the caller's handlers come back when the run returns (a bench or a
        # check that trains in its own process must stay stoppable by SIGTERM)
        previous.update({sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)})
        from mwm.lock import RunLock, RunLocked

        try:  # one process per run folder
            lock = RunLock(run.dir) if run.master else None
        except RunLocked as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            return run.run()
        except ConfigError as exc:  # e.g. a checkpoint that cannot be trusted
            run.write_summary(status="failed", error=str(exc))
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:  # a full disk, a quota, EIO: the OS's own words, one line (no traceback)
            error = f"{type(exc).__name__}: {exc}"
            if exc.filename is not None and Path(exc.filename) == run.ckpt_path:
                error += " (the checkpoint write failed: the previous checkpoint is kept and the run resumes from it)"
            try:
                run.write_summary(status="failed", error=error)
            except OSError as again:
                error += f"; summary.json not written either ({again.strerror})"
            print(f"error: {error}", file=sys.stderr)
            return 1
        except Exception as exc:
            run.write_summary(status="failed", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if lock is not None:
                lock.release()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if world > 1:
            torch.distributed.destroy_process_group()


def _int_at_least(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is above {high}, the largest the schema allows")
        return value

    return parse


def main(argv=None, data=None) -> int:
    """The command line; ``data`` (in process only, not to relaunched ranks): the run's token dataset."""
    ap = argparse.ArgumentParser(prog="python -m mwm.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="config YAML (validated against the schema)")
    ap.add_argument("--assignment", required=True,
                    help="assignment name (none, stiefel, dgram, hetero, hetero-inv, oblique, adamw) or a "
                         "variant with -colnorm suffix")
    ap.add_argument("--seed", type=_int_at_least(0, seed_bound()), required=True,
                    help=f"run seed, 0 to {seed_bound()} (grid.seeds' bound)")
    ap.add_argument("--retraction", choices=RETRACTIONS, default=None,
                    help="DGram retraction (default: train.dgram_retraction of the config)")
    ap.add_argument("--out", default=None,
                    help=f"results root (default: {RESULTS_ROOT}, the workflow's; a run whose overrides change its "
                         f"settings defaults to {RESULTS_ROOT}/{HAND_FOLDER}/<hash> and may not go to {RESULTS_ROOT})")
    ap.add_argument("--threads", type=_int_at_least(1), default=None,
                    help="torch CPU threads of the run, split across its ranks (default: torch's choice)")
    ap.add_argument("--nproc", type=_int_at_least(1), default=None,
                    help="DDP ranks for this run (default: the config's, see mwm.plan.ranks.ranks_per_run); more "
                         "than 1 relaunches this command as that many ranks under torchrun (mwm.train.launch)")
    ap.add_argument("overrides", nargs="*", help="config overrides, dotted.key=value")
    args = ap.parse_args(argv)
    try:
        if args.out is not None:
            check_out_root(args.out)
        cfg = load_config(args.config, args.overrides)
        check_grid(cfg["grid"])
        assignment, suffix_retraction = parse_variant(args.assignment)
        assignment_spec(cfg["grid"], assignment)
        retraction = args.retraction or (suffix_retraction if args.assignment.endswith("-colnorm") else None)
        if suffix_retraction == "colnorm" and not uses_dgram(assignment, cfg["grid"].get("custom")):
            raise ConfigError(f"--assignment {args.assignment}: the colnorm retraction only exists for assignments "
                              f"that use DGram; {assignment!r} does not (train {assignment!r} instead)")
        base = load_config(args.config) if args.overrides else cfg  # the config file's own settings
        check_config(base, source=args.config)  # the file as the workflow checks it
        if args.overrides:  # the run itself, as overridden (a hand run is no grid run: no grid-wide checks)
            check_run(cfg, assignment, source=f"{args.config} with {' '.join(args.overrides)}")
        out = out_root(args, base, cfg, assignment, retraction)
        if int(os.environ.get("RANK", "0")) == 0:
            claim(out, base, args.config)  # the results of base's name belong to this config file
        nproc = args.nproc or ranks_per_run(cfg)
        accum_per_rank(cfg["train"], nproc)  # --nproc too: each rank would refuse it after torchrun started
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # claiming the results folder: read-only, full
        print(f"error: {write_failure(exc, 'the results folder')} (--out)", file=sys.stderr)
        return 1
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        rest = ["--config", args.config, "--assignment", args.assignment, "--seed", str(args.seed),
                "--out", str(out), *(["--retraction", args.retraction] if args.retraction else []),
                *args.overrides]
        return launch(nproc, rest, args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    worker_started()
    try:
        rc = train(cfg, assignment, args.seed, retraction, out, data=data)
    except OSError as exc:  # the run's folder or lock before training (a run's own failures are train's)
        print(f"error: {write_failure(exc, 'the run')} (--out)", file=sys.stderr)
        rc = 1
    return worker_exit(rc)


def out_root(args, base: dict, cfg: dict, assignment: str, retraction: str | None) -> Path:
    """The results root of a hand run: ``--out``, else :data:`RESULTS_ROOT`. A run whose
    overrides change its identity is not the config's run of (assignment, seed): it goes to
    ``RESULTS_ROOT/HAND_FOLDER/<hash of the overridden config>`` (the same root for every run of
    those overrides, their list in ``overrides.json`` there) and is refused in RESULTS_ROOT,
    where it would replace the config's run that the report and the workflow read."""
    if not args.overrides:
        return Path(args.out or RESULTS_ROOT)
    own = config_run_identity(base, assignment, args.seed, retraction)
    diff = identity_diff(config_run_identity(cfg, assignment, args.seed, retraction), own)
    if not diff:
        return Path(args.out or RESULTS_ROOT)
    what = f"overrides {' '.join(args.overrides)} change the run ({'; '.join(diff)})"
    if args.out is None:
        root = hand_root(cfg)
        atomic_write_json(root / "overrides.json", {"config_file": args.config, "overrides": list(args.overrides)})
        print(f"{what}: it is not config {cfg['name']!r}'s run, so it goes to {root} "
              f"({config_dir('runs', cfg['name']).as_posix()}/ holds the config's own runs)", flush=True)
        return root
    if os.path.abspath(args.out) == os.path.abspath(RESULTS_ROOT):
        raise ConfigError(f"{what}: it is not config {cfg['name']!r}'s run (from {args.config}) and would replace "
                          f"that run in {config_dir('runs', cfg['name']).as_posix()}/; leave out --out (it then goes "
                          f"to {RESULTS_ROOT}/{HAND_FOLDER}/<hash>/), give another --out, or put the settings in the "
                          f"config (or a new config with its own name)")
    return Path(args.out)
