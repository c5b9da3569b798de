# Report: every table and figure and the ledger, from results/ only.


rule report:
    input:
        all_runs(),
        ALPHA_FILES,
        ABSORPTION_FILES,
        AUDIT_FILES,
    output:
        directory(f"paper_figures/{NAME}"),
    params:
        config=CONFIG_FILE,
    log:
        f"{LOGS}/report.log",
    threads: threads("report")
    resources:
        **res("report"),
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.report --config {params.config:q} --out {output:q} > {log:q} 2>&1"
