"""A stand-in token dataset for training tests (random ids, no tokenizer needed)."""

import sys
import time
from pathlib import Path

import numpy as np
import yaml

import mwm.train.cli
from mwm.config import load_config, read_config
import mwm.train.loop
import importlib.util
import os
import shutil
import subprocess


class FakeData:
    def __init__(self, vocab=64, n=6000, seed=0):
        r = np.random.default_rng(seed)
        # a learnable pattern plus noise, so the loss moves
        base = np.arange(n) % vocab
        noise = r.integers(0, vocab, n)
        toks = np.where(r.random(n) < 0.7, base, noise)
        self.vocab_size = vocab
        self._s = {"train": toks.astype(np.uint16), "val": toks[: n // 4].astype(np.uint16)}
        for split in self._s.values():
            split.setflags(write=False)  # read-only, as a prepared dataset's memory map is
        self.meta = {"vocab_size": vocab}

    def split(self, s):
        return self._s[s]


TINY = {
    "name": "tiny",
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 16},
    "train": {"batch_size": 4, "max_iters": 12, "eval_interval": 4, "eval_iters": 2, "checkpoint_interval": 4,
              "dual_ascent_steps": 3, "warmup_iters": 2, "lr_decay_iters": 12, "probe_batch": 2,
              "log_interval": 4},
}


#: The stand-in every test run trains on (``data=`` of :func:`mwm.train.cli.main`, ``train``, ``Run``): one
#: read-only instance, as runs share a prepared dataset.
TOKENS = FakeData()


def write_config(path, base=None, **overrides):
    """Write a tiny config to ``path`` and return the path.

    ``base``: the config to start from (a dict, or a config file such as config/ci.yaml, on its scale); ``TINY``
    when None. Overrides: ``section__key=value`` sets one key of a section, ``section={...}``
    updates a section key by key, any other ``key=value`` (``name="x"``) sets a top-level value."""
    if base is None:
        base = TINY
    elif not isinstance(base, dict):
        base = read_config(base)  # on its scale: the copy may lie outside config/
    cfg = yaml.safe_load(yaml.safe_dump(base))  # a deep copy: the base is never changed
    for key, value in overrides.items():
        if "__" in key:
            section, name = key.split("__")
            cfg.setdefault(section, {})[name] = value
        elif isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    path.write_text(yaml.safe_dump(cfg))
    return path


TESTS = Path(__file__).parent
CHILD = (
    "import sys; sys.path.insert(0, {tests!r}); import fakedata\n"
    "from mwm.train.cli import main; sys.exit(main(sys.argv[1:], data=fakedata.TOKENS))\n"
)


def child_cmd(cfg, out, assignment="none", seed=0) -> list[str]:
    """``mwm.train`` on the fake data in a child process (a script beside the config)."""
    script = Path(cfg).parent / "child_train.py"
    script.write_text(CHILD.format(tests=str(TESTS)))
    return [sys.executable, str(script), "--config", str(cfg), "--assignment", assignment, "--seed", str(seed),
            "--out", str(out)]


def wait_for(pred, proc, timeout=180):
    """Poll ``pred`` while the child ``proc`` lives; fail if it exits first or time runs out."""
    t0 = time.time()
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"child exited early with {proc.returncode}: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.05)


def run_main(tmp_path, *extra, assignment="none", seed="0", out="out", **over):
    """``mwm.train.cli.main`` in this process on a tiny config; its return code and run folder."""
    cfg = write_config(tmp_path / "tiny.yaml", **over)
    rc = mwm.train.cli.main(["--config", str(cfg), "--assignment", assignment, "--seed", seed,
                             "--out", str(tmp_path / out), *extra], data=TOKENS)
    return rc, tmp_path / out / "runs" / "tiny" / assignment / f"seed{seed}"


HAS_SNAKEMAKE = importlib.util.find_spec("snakemake") is not None
ROOT = TESTS.parent


def repo_copy(dest: Path) -> Path:
    """A throwaway copy of what the workflow needs (sources, rules, configs, profiles)."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".snakemake")
    for name in ("Snakefile", "rules", "config", "src", "local", "slurm", "profiles", "envs"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    return dest


def snakemake_in(repo: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SNAKEMAKE_PROFILE"}
    env["PYTHONPATH"] = str(repo / "src")
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=timeout)


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Nested anchors: ``levels`` lists of ``width`` aliases of the one before (9^9 = 387M leaves)."""
    lines = ["name: bomb", "x0: &x0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * width) + "]")
    lines.append(f"train: {{batch_size: *x{levels - 1}}}")
    return "\n".join(lines) + "\n"


# -- helpers the training tests share ---------------------------------------------------------
LOSS_COLS = ("step", "train_loss", "lr", "muon_lr")


def run_inprocess(tmp_path, assignment="hetero", seed=0, out="out", tokens=None, **over):
    """``python -m mwm.train`` in this process on a tiny config with ``over``, on ``tokens`` (default:
    :data:`TOKENS`); its code and run folder."""
    cfg_path = write_config(tmp_path / "tiny.yaml", **over)
    rc = mwm.train.cli.main(["--config", str(cfg_path), "--assignment", assignment, "--seed", str(seed),
                             "--out", str(tmp_path / out)], data=TOKENS if tokens is None else tokens)
    return rc, tmp_path / out / "runs" / "tiny" / assignment / f"seed{seed}"


def csv_cols(path, cols):
    """The ``cols`` of a CSV log, row by row, as text."""
    import csv

    with open(path) as fh:
        return [tuple(r[c] for c in cols) for r in csv.DictReader(fh)]


def metric_rows(d):
    """The loss columns of a run's metrics.csv."""
    return csv_cols(d / "metrics.csv", LOSS_COLS)


def tiny_run(tmp_path, assignment="hetero", **over):
    """A built (not started) Run of a tiny config with ``over``."""
    cfg = load_config(write_config(tmp_path / "tiny.yaml", **over))
    return mwm.train.loop.Run(cfg, assignment, 0, "paper", tmp_path / "out", data=TOKENS)
