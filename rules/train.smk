# Training: one job per (assignment variant, seed). A job cut by a time limit or
# preemption exits with 75 after a checkpoint (kept outside the declared outputs,
# under results/checkpoints/); the retry resumes from it. A config with more than one
# rank per run: mwm.train starts the ranks itself (mwm.launch), one node (see res()).


rule train:
    input:
        DATA_FILES,
    output:
        **run_files(),
    params:
        config=CONFIG_FILE,
        train=lambda wildcards: run_train(wildcards.variant),  # with its grid.train_overrides
        capture=lambda wildcards: run_capture(wildcards.variant, wildcards.seed),
        model=CFG["model"],
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
