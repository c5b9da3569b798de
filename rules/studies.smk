# Numerical studies: compute only (CSV + JSON); the report plots them.
# The absorption study also measures (W, G) pairs captured in training when the
# config captures them (train.capture_pairs_step), from the first seed of the
# first grid assignment that uses a manifold; the audits check that run's
# spectral log against the singular-value growth bound.

ALPHA_FILES = [f"{STUDIES}/alpha_{f}" for f in ("derived.json", "summary.csv", "final.csv", "trajectories.csv")]
ABSORPTION_FILES = [f"{STUDIES}/absorption_{f}" for f in ("derived.json", "summary.csv")] + [f"{STUDIES}/absorption.csv"]
AUDIT_FILES = [f"{STUDIES}/{f}" for f in ("audits.json", "softmax_jacobian.csv", "logit_bound.csv", "growth_bound.csv", "tangent_dims.csv")]


def probe_run():
    """(variant, seed) whose pairs and spectral log feed the studies, or None."""
    for v in CFG["grid"]["assignments"]:
        if v not in ("none", "adamw"):
            return v, SEEDS[0]
    return None


def pairs_input(wildcards):
    run = probe_run()
    if run is None or CFG["train"]["capture_pairs_step"] is None:
        return []
    return [f"{RUNS}/{run[0]}/seed{run[1]}/pairs.npz"]


def spectral_input(wildcards):
    run = probe_run()
    return [] if run is None else [f"{RUNS}/{run[0]}/seed{run[1]}/spectral.csv"]


rule study_alpha:
    output:
        ALPHA_FILES,
    params:
        config=CONFIG_FILE,
        studies=CFG["studies"]["alpha"],
    log:
        f"{LOGS}/studies/alpha.log",
    threads: threads("study")
    resources:
        **res("study"),
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.studies.alpha --config {params.config} --out {STUDIES} studies.threads={threads} > {log} 2>&1"


rule study_absorption:
    input:
        pairs=pairs_input,
    output:
        ABSORPTION_FILES,
    params:
        config=CONFIG_FILE,
        studies=CFG["studies"]["absorption"],
        pairs=lambda wildcards, input: f"--pairs {input.pairs}" if input.pairs else "",
    log:
        f"{LOGS}/studies/absorption.log",
    threads: threads("study")
    resources:
        **res("study"),
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.studies.absorption --config {params.config} --out {STUDIES} {params.pairs} "
        "studies.threads={threads} > {log} 2>&1"


rule study_audits:
    input:
        spectral=spectral_input,
    output:
        AUDIT_FILES,
    params:
        config=CONFIG_FILE,
        studies=CFG["studies"]["audits"],
        spectral=lambda wildcards, input: f"--spectral {input.spectral}" if input.spectral else "",
    log:
        f"{LOGS}/studies/audits.log",
    threads: threads("study")
    resources:
        **res("study"),
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.studies.audits --config {params.config} --out {STUDIES} {params.spectral} "
        "studies.threads={threads} > {log} 2>&1"
