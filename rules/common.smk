# What the rules share. Every check of the config runs before any job, in one call (mwm.workflow.preflight);
# what each job reads is the plan's (mwm.plan.runs.Plan) and the stage manifest's (mwm.workflow.targets).
import os
import shlex
import signal
import sys

from mwm.config import ConfigError, compose
from mwm.numerics import VERSION as NUMERICS
from mwm.paths import CONFIG_ENV, checkout_relative
from mwm.plan.runs import RUN_FILES, RUN_FOLDERS
from mwm.plan.ranks import ranks_per_run
from mwm.setaside import RETRAIN_FOLDER, ForeignRuns
from mwm.workflow import stages
from mwm.workflow.owner import claim
from mwm.workflow.preflight import preflight
from mwm.workflow.site import stage_resources
from mwm.workflow.targets import Targets


def refuse(message):
    """Stop before any job with one line naming what to do (a WorkflowError would print the Snakefile's
    stack under it)."""
    print(f"mwm: error: {message}", file=sys.stderr)
    sys.exit(1)


# The file the entry points read: the last --configfile, else the default. Snakemake makes it
# absolute; inside the checkout it is kept relative, so rule params do not change when the checkout moves.
CONFIG_FILE = checkout_relative(
    workflow.overwrite_configfiles[-1] if workflow.overwrite_configfiles else "config/config.yaml"
)
# This Snakefile is also read by the snakemake each job runs (a SLURM job, a subprocess): there the
# workflow-wide checks are the main run's, already done.
IN_JOB = workflow.remote_exec or workflow.subprocess_exec
try:
    PLAN = preflight(CONFIG_FILE, workflow.basedir, dict(workflow.config_settings.config or {}), dict(config), IN_JOB)
except ConfigError as exc:
    refuse(str(exc))
CFG, NAME, FOLDERS = PLAN.cfg, PLAN.name, PLAN.folders
# Snakemake holds the file as written; the HTML report's captions read it on its scale (extends:).
config.update(compose(dict(config), CONFIG_FILE))
TARGETS = Targets(PLAN)
DATA, RUNS, STUDIES, LOGS = FOLDERS["data"], FOLDERS["runs"], FOLDERS["studies"], f"logs/{NAME}"
DATA_FILES = [f"{DATA}/{f}" for f in stages.STAGES["data"].outputs]
REPORT_STUDIES = TARGETS.report_studies
# A finished run that is not the config's own (other numerics, or settings written outside the
# workflow) still looks finished to Snakemake: rule set_aside_foreign_run moves it aside (mwm.setaside).
FOREIGN = ForeignRuns(PLAN)
if FOREIGN.found:
    print(FOREIGN.note(CONFIG_FILE), file=sys.stderr)
study_outputs = TARGETS.study_outputs


onstart:
    claim(PLAN.root, CFG, CONFIG_FILE)  # a real run (not a dry run) records the name's config file


# SLURM sends the warning signal (SIGUSR1) to every process of a job's step, this job's own snakemake
# too, which it would kill; ignored here and so in the shell, it reaches the training process, whose
# handler checkpoints.
if IN_JOB:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

wildcard_constraints:
    variant=r"[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)*",
    seed=r"\d+",


def train_input(wildcards):
    """The data, and the run's markers (mwm.setaside.ForeignRuns.train_markers)."""
    return [*DATA_FILES, *FOREIGN.train_markers(wildcards.variant, wildcards.seed)]


def bench(stage, wildcards=""):
    """Snakemake's benchmark TSV of a job (wall time, CPU time, memory): one file per job under
    logs/<config>/benchmarks/<stage>/ (mwm.workflow.status sums them per stage)."""
    return f"{LOGS}/benchmarks/{stage}/{wildcards or stage}.tsv"


def res(stage):
    """A stage's resources (mwm.workflow.site.stage_resources), with this command line's for training."""
    given = workflow.resource_settings
    try:
        return stage_resources(CFG, stage, ranks_per_run(CFG), given.overwrite_resources.get("train"),
                               given.default_resources)
    except ConfigError as exc:
        refuse(str(exc))


def threads(stage):
    return CFG["workflow"]["resources"][stage]["threads"]


def run_files(variant="{variant}", seed="{seed}"):
    """A run's declared outputs: exactly its published records (mwm.plan.runs.RUN_FILES, RUN_FOLDERS). Its
    by-products (final.pt, the captured pairs.npz and sequence/) are written beside them by the same job;
    the studies that read them take the run's summary.json as their input."""
    run = PLAN.path(variant, seed)
    files = {f.split(".")[0]: f"{run}/{f}" for f in RUN_FILES}
    files.update({d: directory(f"{run}/{d}") for d in RUN_FOLDERS})
    return files


def pairs_files(summaries):
    """The pairs.npz beside each run's summary.json (Plan.pairs_summaries)."""
    return [os.path.join(os.path.dirname(str(f)), "pairs.npz") for f in summaries]


# Snakemake's HTML report: the report folder's files it shows, and their category.
REPORT_PATTERNS = ["{item}.png", "{item}.gif", "{item}.csv"]


def report_category(wildcards):
    return stages.report_category(wildcards.item)
