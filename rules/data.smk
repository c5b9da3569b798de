# Tokenization: the config's corpus into nanoGPT bins (train.bin, val.bin, meta.json).


rule prepare_data:
    output:
        DATA_FILES,
    params:
        config=CONFIG_FILE,
        data=CFG["data"],
    log:
        f"{LOGS}/prepare_data.log",
    benchmark:
        bench("data")
    threads: threads("data")
    resources:
        **res("data"),
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.data prepare --config {params.config:q} --num-proc {threads} > {log:q} 2>&1"
