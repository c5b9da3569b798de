"""The stage manifest: for each stage of the workflow, its rule file, entry point, the config
sections it reads and the files it writes; and the report's categories.

Read by the rules (``rules/*.smk``: outputs and inputs), the report (the study files it loads),
:mod:`mwm.dvcgen` (DVC ``params``: the config sections of each rule file's stages) and the
Snakemake HTML report (the category of each figure and table), so none of them spells these
again. Torch-free (standard library only): the Snakefile imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Stage", "STAGES", "STUDIES", "rule_file_sections", "study_files", "report_category"]


@dataclass(frozen=True)
class Stage:
    """``rule_file``: ``rules/<rule_file>.smk``; ``entry``: ``python -m <entry>``; ``sections``: the config
    sections (DVC's dotted keys allowed) it reads besides ``name``; ``outputs``: the files it writes into
    its folder (a study's: ``results/studies/<name>/``); ``report_reads``: those the report loads."""

    rule_file: str
    entry: str
    sections: tuple[str, ...]
    outputs: tuple[str, ...] = ()
    report_reads: tuple[str, ...] = ()


#: The keys of the solver study that choose which grid runs capture which steps: training reads them
#: (``studies.solvers.source: grid``) as DVC's dotted keys, so other study settings rerun no training.
_CAPTURE_KEYS = tuple(f"studies.solvers.{k}" for k in ("source", "assignments", "seed", "capture_start",
                                                         "capture_length"))

STAGES: dict[str, Stage] = {
    "data": Stage("data", "mwm.data", ("data",), ("train.bin", "val.bin", "meta.json")),
    "alpha": Stage("studies", "mwm.studies.alpha", ("studies",),
                   ("alpha_derived.json", "alpha_summary.csv", "alpha_final.csv", "alpha_trajectories.csv"),
                   ("alpha_derived.json", "alpha_summary.csv", "alpha_trajectories.csv")),
    "absorption": Stage("studies", "mwm.studies.absorption", ("studies",),
                        ("absorption_derived.json", "absorption_summary.csv", "absorption.csv"),
                        ("absorption_derived.json", "absorption_summary.csv")),
    # the audits' growth bound follows the config's own schedule
    "audits": Stage("studies", "mwm.studies.audits", ("studies", "train"),
                    ("audits.json", "softmax_jacobian.csv", "logit_bound.csv", "growth_bound.csv", "tangent_dims.csv",
                     "spectral_check.csv"),
                    ("audits.json", "softmax_jacobian.csv", "tangent_dims.csv")),
    # its capture trainings (source: own) run the config's model and train section
    "solvers": Stage("studies", "mwm.studies.solvers", ("studies", "train", "model"),
                     ("solvers.csv", "solvers_summary.csv", "solvers_derived.json"),
                     ("solvers_summary.csv", "solvers_derived.json")),
    # a variant's assignment (grid.custom) and train overrides come from grid
    "train": Stage("train", "mwm.train", ("train", "model", "grid", *_CAPTURE_KEYS)),
    # the report reads other sections only to describe the scale; their changes reach it through its inputs
    "report": Stage("report", "mwm.report", ()),
}

#: The numerical studies, in the order the report draws them.
STUDIES = ("alpha", "absorption", "audits", "solvers")


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
                     ("sweep", "Sweep"))


def report_category(item: str) -> str:
    """The category a report file (name without extension) is filed under in the HTML report."""
    return next((cat for prefix, cat in REPORT_CATEGORIES if item.startswith(prefix)), "Training")
