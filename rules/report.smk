# Report: every table and figure and the ledger, from results/ only. Its figures, tables and
# ledger are flagged for Snakemake's HTML report (snakemake --report paper_figures/<name>/report.html),
# captioned by report/item.rst.


rule report:
    input:
        all_runs(),
        ALPHA_FILES,
        ABSORPTION_FILES,
        AUDIT_FILES,
        SOLVER_FILES,
    output:
        report(
            directory(f"paper_figures/{NAME}"),
            patterns=REPORT_PATTERNS,
            caption="../report/item.rst",
            category=report_category,
        ),
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
