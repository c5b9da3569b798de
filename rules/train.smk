# Training: one job per (assignment variant, seed). A job cut by a time limit or
# preemption exits with 75 after a checkpoint (kept outside the declared outputs,
# under results/checkpoints/); the retry resumes from it. A config with more than one
# rank per run: mwm.train starts the ranks itself (mwm.train.launch), one node (see res()).
# A finished run that is not the config's own (written outside the workflow) is moved aside
# first by set_aside_foreign_run, whose marker is then an input of its train job (train_input).


rule train:
    input:
        train_input,
    output:
        **run_files(),
    params:
        config=CONFIG_FILE,
        train=lambda wildcards: PLAN.train(wildcards.variant),  # with its grid.train_overrides
        capture=lambda wildcards: PLAN.capture(wildcards.variant, wildcards.seed),
        model=CFG["model"],
        numerics=NUMERICS,  # a numerics change retrains the run
    log:
        f"{LOGS}/train/{{variant}}/seed{{seed}}.log",
    benchmark:
        bench("train", "{variant}/seed{seed}")
    threads: threads("train")
    resources:
        **res("train"),
    retries: CFG["workflow"]["retries"]
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.train --config {params.config:q} --assignment {wildcards.variant} "
        "--seed {wildcards.seed} --threads {threads} --out results > {log:q} 2>&1"


# Moves a run that is not the config's own to results/hand/foreign/<name>/ and writes the marker
# its train job waits for (mwm.setaside); only in the DAG while such a run or a marker exists.
rule set_aside_foreign_run:
    output:
        f"{RUNS}/{RETRAIN_FOLDER}/{{variant}}/seed{{seed}}/{{n}}.json",
    wildcard_constraints:
        n=r"[1-9][0-9]*",
    params:
        config=CONFIG_FILE,
    log:
        f"{LOGS}/set_aside/{{variant}}/seed{{seed}}-{{n}}.log",
    localrule: True
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.setaside --config {params.config:q} --variant {wildcards.variant} "
        "--seed {wildcards.seed} --marker {output:q} > {log:q} 2>&1"
