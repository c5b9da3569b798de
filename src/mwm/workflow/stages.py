"""The stage manifest: for each stage of the workflow, its rule file, entry point, the config
sections it reads and the files it writes; and the report's categories.

Read by the rules (``rules/*.smk``: outputs and inputs), the report (the study files it loads),
:mod:`mwm.workflow.dvc` (DVC ``params``: the config sections of each rule file's stages) and the
Snakemake HTML report (the category of each figure and table), so none of them spells these
again. Torch-free (standard library only): the Snakefile imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from mwm.experiments import EXPERIMENTS, STUDY_NAMES

__all__ = ["Stage", "STAGES", "STUDIES", "REPORT_INPUTS", "PRODUCTS", "SET_ASIDE_RULE", "products",
           "rule_file_sections", "study_files", "report_category"]


@dataclass(frozen=True)
class Stage:
    """``rule_file``: ``rules/<rule_file>.smk``; ``entry``: ``python -m <entry>``; ``sections``: the config
    sections (DVC's dotted keys allowed) it reads besides ``name``; ``files``: what it writes into its
    folder (a study's: ``results/studies/<name>/``), ``{key: file name}``: the writers name a file by its
    key (:meth:`file`), so a file name is spelled here only; ``report_reads``: the files the report loads."""

    rule_file: str
    entry: str
    sections: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)
    report_reads: tuple[str, ...] = ()

    @property
    def outputs(self) -> tuple[str, ...]:
        """The file names the stage writes (what its rule declares), in manifest order."""
        return tuple(self.files.values())

    def file(self, key: str) -> str:
        """The file name of output ``key`` (KeyError naming the stage's keys otherwise)."""
        try:
            return self.files[key]
        except KeyError:
            raise KeyError(f"stage {self.entry}: no output {key!r} in mwm.workflow.stages "
                           f"(has {', '.join(self.files)})") from None


#: The keys of the solver study that choose which grid runs capture which steps: training reads them
#: (``studies.solvers.source: grid``) as DVC's dotted keys, so other study settings rerun no training.
_CAPTURE_KEYS = tuple(f"studies.solvers.{k}" for k in ("source", "assignments", "seed", "rate", "capture_start",
                                                         "capture_length"))

STAGES: dict[str, Stage] = {
    "data": Stage("data", "mwm.data", ("data",), {"train": "train.bin", "val": "val.bin", "meta": "meta.json"}),
    "alpha": Stage("studies", "mwm.studies.alpha", ("studies",),
                   {"derived": "alpha_derived.json", "summary": "alpha_summary.csv", "final": "alpha_final.csv",
                    "trajectories": "alpha_trajectories.csv"},
                   ("alpha_derived.json", "alpha_summary.csv", "alpha_trajectories.csv")),
    # pairs: the training (W, G) pairs' rows (header only when no run captured any)
    "absorption": Stage("studies", "mwm.studies.absorption", ("studies",),
                        {"derived": "absorption_derived.json", "summary": "absorption_summary.csv",
                         "rows": "absorption.csv", "pairs": "absorption_pairs.csv"},
                        ("absorption_derived.json", "absorption_summary.csv")),
    # the audits' growth bound follows the config's own schedule
    "audits": Stage("studies", "mwm.studies.audits", ("studies", "train"),
                    {"derived": "audits.json", "softmax": "softmax_jacobian.csv", "logit_bound": "logit_bound.csv",
                     "growth_bound": "growth_bound.csv", "tangent_dims": "tangent_dims.csv",
                     "spectral_check": "spectral_check.csv"},
                    ("audits.json", "softmax_jacobian.csv", "tangent_dims.csv")),
    # its capture trainings (source: own) run the config's model and train section
    "solvers": Stage("studies", "mwm.studies.solvers", ("studies", "train", "model"),
                     {"rows": "solvers.csv", "summary": "solvers_summary.csv", "derived": "solvers_derived.json"},
                     ("solvers_summary.csv", "solvers_derived.json")),
    # a variant's assignment (grid.custom) and train overrides come from grid
    "train": Stage("train", "mwm.train", ("train", "model", "grid", *_CAPTURE_KEYS)),
    # the report reads other sections only to describe the scale; their changes reach it through its inputs
    # metrics: the config's DVC metrics file (per variant: final val loss over seeds), for `dvc exp show`
    "report": Stage("report", "mwm.report", (), {"metrics": "metrics.json"}),
}

#: The numerical studies, in the order the report draws them (named with the experiments, mwm.experiments).
STUDIES = STUDY_NAMES
#: What each kind of report (``workflow.report``) is built from: the studies it reads, and whether it reads
#: the grid's training runs (the rules' report inputs; ``mwm.workflow.status`` lists these and no others).
REPORT_INPUTS = {name: (e.studies, e.reads_runs) for name, e in EXPERIMENTS.items()}
assert all(study in STAGES for study in STUDIES), "every study of mwm.experiments has a stage here"


#: The kinds of product a config makes, in DAG order; each is a Snakemake target rule (the Snakefile)
#: and a DVC stage (:mod:`mwm.workflow.dvc`) tracking one folder.
PRODUCTS = ("data", "runs", "studies", "figures")
#: The rule that runs ``python -m mwm.setaside`` (``rules/train.smk``): local bookkeeping, no stage of its own;
#: the runs' DVC stage may run it.
SET_ASIDE_RULE = "set_aside_foreign_run"


def products(cfg: dict) -> tuple[str, ...]:
    """The kinds of product ``cfg`` makes: runs when its report reads them or the solver study captures
    from grid runs, studies when its report reads any."""
    studies, with_runs = REPORT_INPUTS[cfg["workflow"]["report"]]
    captures = "solvers" in studies and cfg["studies"]["solvers"]["source"] == "grid"
    made = {"data": True, "runs": with_runs or captures, "studies": bool(studies), "figures": True}
    return tuple(k for k in PRODUCTS if made[k])


def rule_file_sections(rule_file: str) -> tuple[str, ...]:
    """The config sections the stages of one rule file read, in manifest order (KeyError: no such file)."""
    found = [s for st in STAGES.values() if st.rule_file == rule_file for s in st.sections]
    if not any(st.rule_file == rule_file for st in STAGES.values()):
        raise KeyError(rule_file)
    return tuple(dict.fromkeys(found))


def study_files(studies=STUDIES, reads: bool = False) -> tuple[str, ...]:
    """The files the given studies write (``reads``: only those the report loads)."""
    return tuple(f for s in studies for f in (STAGES[s].report_reads if reads else STAGES[s].outputs))


#: Snakemake HTML report categories: (file-name prefix, category), first match; else ``Training``.
REPORT_CATEGORIES = (("ledger", "Ledger"), ("table", "Tables"), ("fig3", "Studies"), ("fig_alpha", "Studies"),
                     ("fig_solvers", "Studies"), ("fig_sweep", "Sweep"),
                     ("sweep", "Sweep"), ("fig_mechanism", "Mechanism"), ("mechanism", "Mechanism"))


def report_category(item: str) -> str:
    """The category a report file (name without extension) is filed under in the HTML report."""
    return next((cat for prefix, cat in REPORT_CATEGORIES if item.startswith(prefix)), "Training")
