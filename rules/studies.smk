# Numerical studies: compute only (CSV + JSON); the report plots them.
# The absorption study also measures (W, G) pairs captured in training when the
# config captures them (train.capture_pairs_step), from the first manifold run that
# has them (hetero preferred: both manifolds; see Plan.pairs_summaries); the audits check a
# DGram-attention run's spectral log against the singular-value growth bound (see
# Plan.spectral_logs, mwm.plan.runs).

# Each study's output files: study_outputs (common.smk: mwm.workflow.targets) from the stage manifest.


rule study_alpha:
    output:
        study_outputs("alpha"),
    params:
        config=CONFIG_FILE,
        out=lambda wildcards, output: os.path.dirname(output[0]),
        numerics=NUMERICS,  # a numerics change reruns the study
        studies=CFG["studies"]["alpha"],
    log:
        f"{LOGS}/studies/alpha.log",
    benchmark:
        bench("study_alpha")
    threads: threads("study")
    resources:
        **res("study"),
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.studies.alpha --config {params.config:q} --out {params.out:q} studies.threads={threads} > {log:q} 2>&1"


rule study_absorption:
    input:
        pairs=lambda wildcards: PLAN.pairs_summaries(),
    output:
        study_outputs("absorption"),
    params:
        config=CONFIG_FILE,
        out=lambda wildcards, output: os.path.dirname(output[0]),
        numerics=NUMERICS,  # a numerics change reruns the study
        studies=CFG["studies"]["absorption"],
        pairs=lambda wildcards, input: (
            "--pairs " + " ".join(shlex.quote(f) for f in pairs_files(input.pairs)) if input.pairs else ""),
    log:
        f"{LOGS}/studies/absorption.log",
    benchmark:
        bench("study_absorption")
    threads: threads("study")
    resources:
        **res("study"),
    conda:
        "../envs/mwm.yaml"
    shell:
        # overrides before --pairs, which takes every argument after it
        "python -m mwm.studies.absorption --config {params.config:q} --out {params.out:q} studies.threads={threads} "
        "{params.pairs} > {log:q} 2>&1"


rule study_audits:
    input:
        spectral=lambda wildcards: PLAN.spectral_logs(),
    output:
        study_outputs("audits"),
    params:
        config=CONFIG_FILE,
        out=lambda wildcards, output: os.path.dirname(output[0]),
        numerics=NUMERICS,  # a numerics change reruns the study
        studies=CFG["studies"]["audits"],
        train=CFG["train"],  # the growth bound over the config's own schedule
        spectral=lambda wildcards, input: f"--spectral {shlex.quote(str(input.spectral))}" if input.spectral else "",
    log:
        f"{LOGS}/studies/audits.log",
    benchmark:
        bench("study_audits")
    threads: threads("study")
    resources:
        **res("study"),
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.studies.audits --config {params.config:q} --out {params.out:q} {params.spectral} "
        "studies.threads={threads} > {log:q} 2>&1"


# Inner solvers against the paper's dual ascent on (W, momentum) sequences captured by the
# grid's own runs (studies.solvers.source: grid), or by a short training of the config's model
# that the study runs itself (source: own, train.capture_sequence).
rule study_solvers:
    input:
        DATA_FILES,
        sequences=lambda wildcards: PLAN.solver_sequences(),
    output:
        study_outputs("solvers"),
    params:
        config=CONFIG_FILE,
        out=lambda wildcards, output: os.path.dirname(output[0]),
        numerics=NUMERICS,  # a numerics change reruns the study
        studies=CFG["studies"]["solvers"],
        train=CFG["train"],  # the capture trainings run the config's model and train section
        model=CFG["model"],
    log:
        f"{LOGS}/studies/solvers.log",
    benchmark:
        bench("study_solvers")
    threads: threads("study")
    resources:
        **res("study"),
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.studies.solvers --config {params.config:q} --out {params.out:q} studies.threads={threads} "
        "> {log:q} 2>&1"
