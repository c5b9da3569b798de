# Helpers shared by the rules, and validation of the config before any job starts.
import json
import os
import shlex
import signal
import sys

from mwm.plan.checks import check_config, check_splits
from mwm.config import PLANNED_ENV, ConfigError, load_config, planned_stamp
from mwm.data import DataError, TokenDataset, dataset_dir
from mwm.train.launch import ranks_per_run
from mwm.config.names import UNCONSTRAINED
from mwm.numerics import VERSION as NUMERICS
from mwm.workflow.owner import check_owner, claim
from mwm.workflow.dvc import PERSISTENT
from mwm.paths import CONFIG_ENV, checkout_relative, first_on_pythonpath, inside, leads_out
from mwm.plan.runs import CONFIG_KINDS, RESULTS_ROOT, RUN_FILES, RUN_FOLDERS, Plan, check_grid, config_dir
from mwm.workflow import stages
from mwm.workflow.site import site_resources
from mwm.setaside import RETRAIN_FOLDER, SET_ASIDE_RULE, foreign_problem, foreign_root, next_marker, retrain_markers

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
# The data job reads it from here, not from its params, since a dataset's identity is its data
# section, whichever config asked for it (configs sharing a data folder do not invalidate each other).
os.environ[CONFIG_ENV] = CONFIG_FILE
# This Snakefile is also read by the snakemake each job runs (a SLURM job, a subprocess): there the
# workflow-wide checks and settings below are the main run's, already done.
IN_JOB = workflow.remote_exec or workflow.subprocess_exec
# Every job's python finds the package of this checkout, whatever environment runs it (--sdm conda
# builds one from envs/mwm.yaml, which holds the dependencies only; SLURM jobs inherit this).
first_on_pythonpath(os.path.join(workflow.basedir, "src"))


def _load():
    given = dict(workflow.config_settings.config or {})
    if given:  # before validation: a --config value would otherwise read as a type error in the file
        refuse(
            f"--config {' '.join(sorted(given))} on the command line is refused: the entry points "
            f"(training, studies, report) read the config file itself ({CONFIG_FILE}), so a value given "
            "only to Snakemake would make the two disagree. Put the setting in a config file (a copy with "
            "its own name) and pass it with --configfile"
        )
    try:
        cfg = load_config(CONFIG_FILE)
        check_grid(cfg["grid"])
        ranks_per_run(cfg)
        check_config(cfg, source=CONFIG_FILE)  # model shape, grid.custom patterns: no data needed
        meta = _meta(dataset_dir(cfg["data"]) / "meta.json")
        if meta is not None:  # made already (maybe by another config): its splits against block_size
            check_splits(cfg, meta, str(dataset_dir(cfg["data"]) / "meta.json"), source=CONFIG_FILE)
        check_owner(RESULTS_ROOT, cfg, CONFIG_FILE)  # a copied config keeping the name is refused
    except ConfigError as exc:
        refuse(str(exc))
    if validated_snakemake_config() != cfg:
        refuse(
            "--config overrides are not supported: the entry points read the config file itself. "
            f"Put the settings in a config file and pass --configfile (read: {CONFIG_FILE})"
        )
    return cfg


def _meta(path):
    """A data folder's meta.json, or None when it is missing or unreadable (a job cut while writing
    it: Snakemake reruns that job, which checks its own output)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def validated_snakemake_config():
    try:
        from mwm.config import exponent_floats, validate

        raw = exponent_floats(dict(config))  # Snakemake reads YAML 1.1: "1e6" is a string there
        raw.setdefault("name", os.path.splitext(os.path.basename(CONFIG_FILE))[0])
        return validate(raw, source=f"{CONFIG_FILE} (as Snakemake merged it)")
    except ConfigError as exc:
        refuse(str(exc))


CFG = _load()
if not IN_JOB:
    # every job (SLURM ones through sbatch --export=ALL) refuses the file if it is edited from now on
    os.environ[PLANNED_ENV] = planned_stamp(CONFIG_FILE, CFG)
NAME = CFG["name"]
try:  # the schema already refuses such names; a path from the config never leaves its parent
    for _kind in CONFIG_KINDS:
        config_dir(_kind, NAME)
    inside("logs", NAME, what="config name (in logs)")
except ConfigError as exc:
    refuse(str(exc))
PLAN = Plan(CFG)  # the runs the config makes, their settings and folders (mwm.plan.runs)
FOLDERS = PLAN.folders  # where each kind of product lives (the DVC stages' outputs too)
DATA = FOLDERS["data"]
DATA_FILES = [f"{DATA}/{f}" for f in stages.STAGES["data"].outputs]


def _check_data():
    """A prepared data folder is judged here, before any job: found inside each training job, a
    damaged bin would fail it after Snakemake had deleted that run's outputs. The verdict is cached
    (mwm.data's .verified.json), so only a changed bin is hashed again."""
    if IN_JOB or _meta(dataset_dir(CFG["data"]) / "meta.json") is None:
        return  # a job's entry point checks its own data; a folder not made yet is the data job's
    try:
        ds = TokenDataset(DATA)
        if not ds.verified():
            print(f"mwm: verifying {DATA} (sha256 of its bins, once after each change)", file=sys.stderr)
            ds.verify_cached()
    except DataError as exc:
        refuse(f"{exc}. Found before any job ran, so no run was deleted: delete {DATA}/ and run "
                            "again (the data job prepares it anew and the runs trained on it are retrained)")


_check_data()

RUN_VARIANTS = list(PLAN.variants)  # every trained variant (mwm.config.names.variant_name)
SEEDS = list(PLAN.seeds)
RUNS = FOLDERS["runs"]
STUDIES = FOLDERS["studies"]


def _check_dvc_stage():
    """Under `dvc repro` (DVC names the stage in DVC_STAGE): a stage whose outputs' folder leads out of
    the repository (a symlinked data/ or results/) is refused before it runs; DVC, unable to git-ignore
    them there, would fail only after it. The data stage's outputs persist, so DVC deleted none of them."""
    stage = os.environ.get("DVC_STAGE", "").rpartition(":")[2]
    if not stage or IN_JOB:
        return
    for kind, folder in FOLDERS.items():
        real = leads_out(f"{folder}/-", os.environ.get("DVC_ROOT", ".")) if stage == kind else None
        if real:
            kept = "nothing was deleted" if kind in PERSISTENT else "DVC removed the stage's outputs before this"
            refuse(
                f"DVC stage {stage}: {folder} is {real}, outside the repository, where DVC cannot track files (it "
                f"would fail after the stage ran); refused before any job ({kept}). Keep the folder inside the "
                "repository and put DVC's cache on the scratch disk (docs/dvc.md, 'Data on scratch'), or run "
                "this config with snakemake alone")


_check_dvc_stage()


def study_outputs(*names):
    """The files the named studies write (mwm.workflow.stages), in the config's study folder."""
    return [f"{STUDIES}/{f}" for f in stages.study_files(names)]


onstart:
    claim(RESULTS_ROOT, CFG, CONFIG_FILE)  # a real run (not a dry run) records the name's config file


# SLURM sends the warning signal (SIGUSR1) to every process of a job's step, this job's own snakemake
# too, which it would kill; ignored here and so in the shell, it reaches the training process, whose
# handler checkpoints.
if IN_JOB:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

# Snakemake locks the folder while a DAG runs and refuses a second one, suggesting --unlock, which would
# break the first. Say what to do before that (not in the jobs of a run, which see its own lock).
_LOCKS = os.path.join(".snakemake", "locks")
if not IN_JOB and os.path.isdir(_LOCKS) and os.listdir(_LOCKS):
    print(f"mwm: a Snakemake run holds this folder ({_LOCKS}). Several configs run in one DAG after another, or "
          "in separate checkouts that share data/ (docs/running.md, 'Several configs'). Use --unlock only when "
          "no Snakemake runs here (a killed run leaves its lock behind).", file=sys.stderr)


def foreign_runs():
    """``{(variant, seed): why}`` for every finished run of the grid whose summary is not the config's own."""
    out = {}
    for v in RUN_VARIANTS:
        for s in SEEDS:
            problem = foreign_problem(PLAN, v, s)
            if problem:
                out[v, s] = problem
    return out


# A run that is not the config's own (other numerics, or other settings written outside the
# workflow) still looks finished to Snakemake; its train job gets one more input, a marker that rule
# set_aside_foreign_run makes after moving the run aside (mwm.setaside), so the run is retrained.
_FOREIGN = foreign_runs() if PLAN.trains else {}
if _FOREIGN:
    print(f"mwm: {len(_FOREIGN)} finished run(s) of {CONFIG_FILE} are not the config's own (other settings, e.g. "
          "an older mwm.train with overrides, or other numerics; the report refuses them): rule "
          f"{SET_ASIDE_RULE} moves each to {foreign_root(RESULTS_ROOT, NAME)}/<variant>/seed<S>-<UTC time>/ "
          "(nothing is deleted) and the workflow retrains it:\n  "
          + "\n  ".join(f"{PLAN.path(v, s)}/summary.json: {why}" for (v, s), why in _FOREIGN.items()),
          file=sys.stderr)


def train_input(wildcards):
    """The data, and the run's markers (mwm.setaside): every one made before, so that the set of
    inputs stays the same once the run is retrained, and the next one while the run is foreign."""
    markers = retrain_markers(RESULTS_ROOT, NAME, wildcards.variant, wildcards.seed)
    if (wildcards.variant, int(wildcards.seed)) in _FOREIGN:
        markers.append(next_marker(RESULTS_ROOT, NAME, wildcards.variant, wildcards.seed))
    return [*DATA_FILES, *(m.as_posix() for m in markers)]


LOGS = f"logs/{NAME}"


def bench(stage, wildcards=""):
    """Snakemake's benchmark TSV of a job (wall time, CPU time, memory): one file per job under
    logs/<config>/benchmarks/<stage>/ (mwm.workflow.status sums them per stage)."""
    return f"{LOGS}/benchmarks/{stage}/{wildcards or stage}.tsv"

def _given_resource(table, key):
    """A resource as the command line or a profile gave it (--set-resources, --default-resources)."""
    r = (table or {}).get(key)
    if r is None:
        return None
    raw = r.raw if r.raw is not None else r.value
    return None if raw is None else str(raw).strip().strip("'\"").strip()


def train_slurm_extra(signal_opt):
    """The training jobs' sbatch extras: a site's --default-resources slurm_extra with the warning
    signal added; a --set-resources train:slurm_extra would replace the signal, so one without it is
    refused (a run past its time limit would lose every step since its last checkpoint)."""
    given = workflow.resource_settings
    mine = _given_resource(given.overwrite_resources.get("train"), "slurm_extra")
    if mine is not None and "--signal" not in mine:
        refuse(
            f"--set-resources train:slurm_extra={mine} replaces the training jobs' {signal_opt} (SLURM's "
            f"warning before the time limit, workflow.warning_signal_s): give both, "
            f"--set-resources \"train:slurm_extra='{mine} {signal_opt}'\"")
    site = _given_resource(given.default_resources, "slurm_extra")
    return signal_opt if not site else site if "--signal" in site else f"{site} {signal_opt}"


def res(stage):
    """Resources of a stage from the config's workflow section, with the SLURM site settings of its
    kind of job (GPU or CPU) from the environment (mwm.workflow.site)."""
    r = dict(CFG["workflow"]["resources"][stage])
    try:
        site = site_resources(r["gpu"])
    except ConfigError as exc:
        refuse(str(exc))
    out = {"mem_mb": r["mem_mb"], "runtime": r["runtime"], **site}
    if stage == "train" and CFG["workflow"]["warning_signal_s"]:
        # SLURM's warning before the time limit: the run checkpoints and exits 75 (ignored elsewhere)
        out["slurm_extra"] = train_slurm_extra(f"--signal=USR1@{CFG['workflow']['warning_signal_s']}")
    if stage == "train" and ranks_per_run(CFG) > 1:
        # mwm.train starts the ranks itself (torchrun --standalone): one task on one node
        # with every GPU and thread of the run (SLURM tasks would rerun the whole job step)
        out["nodes"] = 1
    return out


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


def run_train(variant):
    """The train section a run of ``variant`` trains with (grid.train_overrides merged), so an
    edit of its overrides reruns it as an edit of train does (equal to train without overrides)."""
    return PLAN.train(variant)


def all_runs():
    return [f"{PLAN.path(v, s)}/{f}" for v in RUN_VARIANTS for s in SEEDS for f in (*RUN_FILES, *RUN_FOLDERS)]


# What the report reads: the studies, and whether the grid's runs (mwm.workflow.stages.REPORT_INPUTS).
REPORT_STUDIES, REPORT_READS_RUNS = stages.REPORT_INPUTS[CFG["workflow"]["report"]]


def run_targets():
    """The runs the config makes: those its report reads, and the solver study's captures."""
    return list(dict.fromkeys([*foreign_markers(), *(all_runs() if REPORT_READS_RUNS else []),
                               *solver_sequences(None)]))


def run_capture(variant, seed):
    """The steps the run captures for the solver study (None: none), so a change of the
    study's window reruns exactly the runs that capture."""
    return PLAN.capture(variant, seed)


def solver_sequences(wildcards):
    """The grid runs the solver study reads (studies.solvers.source: grid), else none: it
    trains its own captures. Their sequence/ is written with the run's summary.json."""
    sec = CFG["studies"]["solvers"]
    if sec["source"] != "grid":
        return []
    return [f"{PLAN.path(v, sec['seed'])}/{f}" for v in PLAN.capture_variants for f in ("summary.json", "metrics.csv")]


wildcard_constraints:
    variant=r"[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)*",
    seed=r"\d+",


def probe_run(prefer):
    """(variant, seed) of the first grid assignment in ``prefer`` (else the first that
    uses a manifold) at the first seed, or None: its data feeds the studies."""
    constrained = [v for v in CFG["grid"]["assignments"] if v not in UNCONSTRAINED]
    for v in [p for p in prefer if p in constrained] + constrained:
        return v, SEEDS[0]
    return None


def pairs_input(wildcards):
    """Training (W, G) pairs for the absorption study, in order of preference (hetero has
    both manifolds): every manifold run at the first seed, by its summary.json (its pairs.npz
    is written with it: pairs_files). The study uses the first that captured them; a run
    unstable before the capture step writes a "not captured" file."""
    if CFG["train"]["capture_pairs_step"] is None:
        return []
    prefer = ("hetero", "hetero-inv", "stiefel", "dgram")
    constrained = [v for v in CFG["grid"]["assignments"] if v not in UNCONSTRAINED]
    order = list(dict.fromkeys([p for p in prefer if p in constrained] + constrained))
    return [f"{PLAN.path(v, SEEDS[0])}/summary.json" for v in order]


def pairs_files(summaries):
    """The pairs.npz beside each run's summary.json (pairs_input)."""
    return [os.path.join(os.path.dirname(str(f)), "pairs.npz") for f in summaries]


def spectral_input(wildcards):
    """A spectral log for the growth-bound audit: DGram attention is where it bites."""
    run = probe_run(("dgram", "hetero-inv", "hetero"))
    return [] if run is None else [f"{PLAN.path(*run)}/spectral.csv"]


def foreign_markers():
    """The markers the config's foreign runs wait for, as targets of their own: where Snakemake has no
    records of the runs' settings (a restored, synced or copied checkout), no changed param would make
    their train jobs run, and a marker wanted only by a job that need not run is never made."""
    return [next_marker(RESULTS_ROOT, NAME, v, s).as_posix() for v, s in _FOREIGN]


def all_targets():
    return [*foreign_markers(), FOLDERS["figures"]]


# Snakemake's HTML report: the report folder's files it shows, and their category.
REPORT_PATTERNS = ["{item}.png", "{item}.gif", "{item}.csv"]


def report_category(wildcards):
    return stages.report_category(wildcards.item)
