"""A rehearsal of the paper's DAG on CPU: config/paper.yaml at GPT-2 small shapes, 2 steps per run.

    python -m mwm.workflow.rehearsal write [--paper config/paper.yaml] [--out config/generated/paper-rehearsal.yaml]
    python -m mwm.workflow.rehearsal record [--logs logs/paper-rehearsal] [--out FILE.json]

``write`` derives the rehearsal config from the paper's: every setting is the paper's except the
cuts in :data:`CUTS`, each with the reason it has to go on a CPU node. The model (GPT-2 small,
124M parameters, block 1024, vocabulary 50304), the assignments, the seeds, the retraction
ablation, the inner solver, the bfloat16 msign and the study kinds stay the paper's, so the
same rules, job kinds and products run: what `snakemake --profile slurm all` on the paper
config does, shrunk only in length and in the studies' grids. ``record`` reads the benchmark files
Snakemake wrote (one per job) and writes each stage's wall time and peak memory as JSON.

``scripts/rehearse_paper.sh`` runs both around a ``--profile slurm`` run on the one-node cluster.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

from mwm.config import ConfigError, apply_overrides, read_config, validate
from mwm.io import atomic_write_text

__all__ = ["NAME", "CUTS", "rehearsal_config", "write", "stage_record", "markdown", "main"]

#: The rehearsal's config name: its own results, logs and figures folders.
NAME = "paper-rehearsal"

#: What the rehearsal changes in config/paper.yaml, and why; everything else is the paper's.
CUTS: dict[str, tuple[object, str]] = {
    "data.corpus": ("shakespeare", "OpenWebText downloads from Hugging Face; Shakespeare ships offline "
                                   "(tokenized with the full GPT-2 vocabulary, as the paper's)"),
    "model.size": (None, "GPT-2 small's shapes spelled out, so that the depth can be cut"),
    "model.n_layer": (1, "one block of GPT-2 small: every matrix shape, the block size and the vocabulary stay, "
                         "but the optimizer's cost is a twelfth (at 12 blocks one All DGram step took 491 s "
                         "and its solver-quality pass about as long on 2 cores: hours per run)"),
    "model.n_head": (12, "GPT-2 small's"),
    "model.n_embd": (768, "GPT-2 small's"),
    "grid.seeds": ([0], "one seed: every assignment, the ablation and every product still run"),
    "train.max_iters": (2, "2 steps per run: every stage runs, nothing trains"),
    "train.warmup_iters": (1, "inside the 2 steps"),
    "train.lr_decay_iters": (2, "inside the 2 steps"),
    "train.eval_interval": (2, "evaluations (spectra, attention, solver quality) at the start and the end"),
    "train.eval_iters": (1, "one batch per split"),
    "train.log_interval": (1, "a metrics row per step"),
    "train.checkpoint_interval": (1, "a checkpoint per step: the resume path runs"),
    "train.batch_size": (1, "64 sequences of 1024 tokens is hours per step on 2 CPU cores"),
    "train.probe_batch": (1, "one sequence for the attention probe"),
    "train.device": ("cpu", "no GPU"),
    "train.dtype": ("float32", "bfloat16 autocast runs on GPU only (msign keeps the paper's bfloat16)"),
    "train.compile": (False, "inductor on CPU compiles for minutes per run"),
    "train.tf32": (False, "TF32 is a GPU setting"),
    "studies.device": ("cpu", "no GPU"),
    "studies.threads": (2, "the node's cores"),
    "studies.alpha.sizes": ([16, 64, 768], "the smallest size and the two the paper compares"),
    "studies.alpha.alpha_grid": ({"min": 0.002, "max": 0.5, "num": 3}, "the grid's ends and middle"),
    "studies.alpha.seeds": (2, "two seeds: a spread exists"),
    "studies.alpha.iterations": (10, "ten iterations per cell"),
    "studies.alpha.fit_min_n": (16, "the fit runs on the sizes left"),
    "studies.absorption.sizes": ([16, 64, 768], "as the alpha study"),
    "studies.absorption.seeds": (2, "as the alpha study"),
    "studies.absorption.reference_iterations": (20, "a short reference"),
    "studies.absorption.snapshots": ([5, 10], "two snapshots inside the reference"),
    "studies.absorption.report_T": (10, "a snapshot"),
    "studies.absorption.flatness_T": ([5, 10], "the snapshots"),
    "studies.audits.softmax": ({"sizes": [2, 16, 1024], "random_per_size": 20, "adversarial_restarts": 2,
                                "adversarial_steps": 10}, "three sizes, few draws"),
    "studies.solvers.capture_start": (1, "the window inside the 2 steps"),
    "studies.solvers.capture_length": (1, "one captured step"),
    "studies.solvers.reference_iterations": (20, "a short reference"),
    "studies.solvers.converged_iterations": (10, "a short converged solve"),
    "workflow.resources.data": ({"threads": 2, "mem_mb": 8000, "runtime": 60, "gpu": 0}, "the one node"),
    "workflow.resources.study": ({"threads": 2, "mem_mb": 16000, "runtime": 120, "gpu": 1},
                                 "the one node (its fake GPU keeps the paper's gres request)"),
    "workflow.resources.train": ({"threads": 2, "mem_mb": 16000, "runtime": 120, "gpu": 1},
                                 "the one node (its fake GPU keeps the paper's gres request)"),
    "workflow.resources.report": ({"threads": 2, "mem_mb": 8000, "runtime": 60, "gpu": 0}, "the one node"),
}


def _cut(paper: dict) -> dict:
    """The paper's raw config with :data:`CUTS` applied and the rehearsal's name; not validated."""
    raw = copy.deepcopy(paper)
    raw["name"] = NAME
    overrides = [f"{key}={json.dumps(value)}" for key, (value, _) in CUTS.items()]
    return apply_overrides(raw, overrides, source="mwm.workflow.rehearsal.CUTS")


def rehearsal_config(paper: dict) -> dict:
    """The paper's raw config with :data:`CUTS` applied and the rehearsal's name; validated."""
    return validate(_cut(paper), source="the rehearsal of config/paper.yaml")


#: The first line of every file :func:`write` makes: the one kind of file it may write over.
GENERATED = "# Generated by `python -m mwm.workflow.rehearsal write`"


def _check_out(out: Path) -> None:
    """Refuse an output that is a folder, or a file that ``write`` did not make (a config of the checkout)."""
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give the file to write (default config/generated/{NAME}.yaml)")
    if out.exists():
        try:
            first = out.read_text(errors="replace").split("\n", 1)[0]
        except OSError as exc:
            raise ConfigError(f"--out {out} cannot be read ({exc.strerror}), so it may not be overwritten") from None
        if not first.startswith(GENERATED):
            raise ConfigError(f"--out {out} exists and is not a rehearsal config this command wrote (a config of "
                              "yours?): refused, nothing written; choose another file")


def write(paper: Path, out: Path) -> Path:
    """Write the rehearsal config derived from ``paper`` to ``out`` (atomically), with its cuts as comments;
    ConfigError for an ``out`` that is a folder or another file (:func:`_check_out`)."""
    _check_out(out)
    cut = _cut(read_config(paper))  # on its scale: the file written is whole, read from anywhere
    validate(copy.deepcopy(cut), source="the rehearsal of config/paper.yaml")  # refuse before writing anything
    head = [f"{GENERATED} from {paper.as_posix()}: do not edit.",
            "# The paper's settings with these cuts (mwm.workflow.rehearsal.CUTS):"]
    head += [f"#   {key}: {why}" for key, (_, why) in CUTS.items()]
    atomic_write_text(out, "\n".join(head) + "\n" + json.dumps(cut, indent=1) + "\n")
    return out


def stage_record(logs: Path) -> dict[str, dict]:
    """Per stage: jobs, summed and longest wall time (s), and the largest peak RSS (MB) of its jobs."""
    from mwm.workflow.status import read_benchmarks

    record: dict[str, dict] = {}
    for stage, jobs in sorted(read_benchmarks(logs).items()):
        walls = [j["s"] for j in jobs.values()]
        rss = [j["max_rss"] for j in jobs.values() if j.get("max_rss") is not None]
        record[stage] = {"jobs": len(jobs), "wall_s_sum": round(sum(walls), 1),
                         "wall_s_max": round(max(walls), 1) if walls else None,
                         "peak_rss_mb": round(max(rss), 1) if rss else None}
    return record


def markdown(record: dict[str, dict]) -> str:
    """The record as a Markdown table (docs/measured.md)."""
    lines = ["| stage | jobs | wall, summed (s) | longest job (s) | peak RSS (MB) |", "| --- | --- | --- | --- | --- |"]
    for stage, r in record.items():
        lines.append(f"| {stage} | {r['jobs']} | {r['wall_s_sum']} | {r['wall_s_max']} | {r['peak_rss_mb']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mwm.workflow.rehearsal",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="derive the rehearsal config from the paper's")
    w.add_argument("--paper", type=Path, default=Path("config/paper.yaml"))
    w.add_argument("--out", type=Path, default=Path(f"config/generated/{NAME}.yaml"))
    r = sub.add_parser("record", help="each stage's wall time and peak memory, from Snakemake's benchmarks")
    r.add_argument("--logs", type=Path, default=Path("logs") / NAME)
    r.add_argument("--out", type=Path, default=None, help="also write the record as JSON here")
    args = parser.parse_args(argv)
    try:
        if args.command == "write":
            print(write(args.paper, args.out))
            return 0
        rec = stage_record(args.logs)
        if not rec:
            found = sorted((args.logs / "benchmarks").glob("*/**/*.tsv"))
            raise ConfigError(f"no readable benchmark file under {args.logs}/benchmarks: " + (
                f"{len(found)} could not be read (not Snakemake's benchmark TSV, or cut short), e.g. {found[0]}"
                if found else "none there: has the rehearsal run?"))
        if args.out is not None:
            atomic_write_text(args.out, json.dumps(rec, indent=1) + "\n")
        print(markdown(rec))
        return 0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
