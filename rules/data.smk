# Tokenization: the config's corpus into nanoGPT bins (train.bin, val.bin, meta.json).


rule prepare_data:
    output:
        DATA_FILES,
    params:
        data=CFG["data"],  # the dataset's identity; the config file comes from the environment (common.smk)
    log:
        f"{LOGS}/prepare_data.log",
    benchmark:
        bench("data")
    # on the submit host where compute nodes are offline (workflow.data_on_submit_host)
    localrule: CFG["workflow"]["data_on_submit_host"]
    threads: threads("data")
    resources:
        **res("data"),
    conda:
        "../envs/mwm.yaml"
    shell:
        f'python -m mwm.data prepare --config "${CONFIG_ENV}" --num-proc {{threads}} > {{log:q}} 2>&1'
