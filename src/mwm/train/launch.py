"""Multi-process training runs: the one place that starts N DDP ranks for one run.

    python -m mwm.train.launch --nproc 2 -- --config config/x.yaml --assignment hetero --seed 0

runs ``python -m mwm.train ARGS`` as N ranks under ``torchrun --standalone
--nproc_per_node N`` (one node: N GPUs, or N gloo ranks on CPU). ``python -m
mwm.train`` calls it itself when the config asks for more than one rank per run
(:func:`mwm.plan.ranks.ranks_per_run`: ``workflow.ranks_per_run``, else one rank per GPU of
``workflow.resources.train.gpu``), so the workflow's ``train`` rule and a user by
hand run the same command. Under SLURM the job is one task on one node holding the
run's GPUs and CPUs (``rules/common.smk``); torchrun starts the ranks inside it.

What a single process does, the launcher keeps for N:

- ``--threads T`` is the job's CPU threads: each rank gets ``max(1, T // N)``;
- SIGTERM / SIGUSR1 (a scheduler's warning) reach every rank, which agree on the
  step to stop at, write one checkpoint and exit 75; the launcher then exits 75
  too (torchrun alone would report a failure, and dies on SIGUSR1);
- otherwise the exit status is the ranks' common one (torchrun's when a rank crashed).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mwm.lock import pid_alive

__all__ = ["launch", "worker_started", "worker_exit", "main"]

#: set for the ranks: a folder where each writes ``pid.<rank>`` and ``rc.<rank>``
LAUNCH_DIR_ENV = "MWM_LAUNCH_DIR"


def worker_started() -> None:
    """Called by each rank when launched by :func:`launch`: record its pid."""
    folder = os.environ.get(LAUNCH_DIR_ENV)
    if not folder:
        return
    if sys.platform.startswith("linux"):
        # torchrun puts each rank in a session of its own: without this, a SIGKILL of
        # the job (launcher and torchrun) would leave the ranks training on as orphans
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    Path(folder, f"pid.{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))


def worker_exit(rc: int) -> int:
    """Called by each rank with its exit status (returned unchanged)."""
    folder = os.environ.get(LAUNCH_DIR_ENV)
    if folder:
        Path(folder, f"rc.{os.environ.get('RANK', '0')}").write_text(str(rc))
    return rc


def _read(folder: Path, kind: str) -> dict[int, int]:
    out = {}
    for f in folder.glob(f"{kind}.*"):
        try:
            out[int(f.suffix[1:])] = int(f.read_text())
        except ValueError:
            pass
    return out


def launch(nproc: int, train_args: list[str], threads: int | None = None, wait_s: float = 300.0) -> int:
    """Run ``python -m mwm.train train_args`` as ``nproc`` ranks; returns the exit status."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    per_rank = max(1, threads // nproc) if threads else None
    args = list(train_args)
    if per_rank:
        args += ["--threads", str(per_rank)]
    with tempfile.TemporaryDirectory(prefix="mwm-launch-") as tmp:
        folder = Path(tmp)
        env = dict(os.environ, **{LAUNCH_DIR_ENV: tmp})
        if per_rank:
            env["OMP_NUM_THREADS"] = str(per_rank)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "mwm.train", *args]
        print(f"launching {nproc} ranks: {' '.join(cmd)}", flush=True)
        # torchrun dies on SIGUSR1 (a scheduler's warning sent to the whole job) and would
        # take the ranks with it: it ignores it (inherited); the ranks set their own handler
        proc = subprocess.Popen(cmd, env=env, preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN))
        signalled = []

        def forward(signum, frame):
            signalled.append(signum)
            for pid in _read(folder, "pid").values():
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass

        old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1)}
        try:
            rc = proc.wait()
            # ranks outlive torchrun when it was signalled itself: wait for their statuses
            t0 = time.monotonic()
            while (any(pid_alive(p) for p in _read(folder, "pid").values())
                   and time.monotonic() - t0 < wait_s):
                time.sleep(0.2)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        codes = _read(folder, "rc")
    if len(codes) == nproc and len(set(codes.values())) == 1:
        return codes[0]  # every rank ended the same way: completed, preempted (75), bad input (2)
    if rc == 0:
        return 0
    return rc if rc > 0 else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mwm.train.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, required=True, help="ranks on this node")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of the whole run (split across ranks)")
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="arguments of python -m mwm.train (after --)")
    a = ap.parse_args(argv)
    rest = a.train_args[1:] if a.train_args[:1] == ["--"] else a.train_args
    return launch(a.nproc, rest, a.threads)


if __name__ == "__main__":
    sys.exit(main())
