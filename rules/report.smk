# Report: every table and figure and the ledger, from results/ only. Its figures, tables and
# ledger are flagged for Snakemake's HTML report (snakemake --report paper_figures/<name>/report.html),
# captioned by captions/item.rst. A config whose workflow.report is "solvers" (config/widths.yaml)
# reports the solver study alone, so its `all` trains nothing beyond the study's captures; one whose
# workflow.report is "sweep" (config/sweep.yaml) reports its learning-rate sweep from its runs alone; one
# whose workflow.report is "mechanism" (config/mechanism.yaml) its causal experiment from its runs and
# the solver study on pairs one of them captured; "mechanism2" and "mechanism3" (config/mechanism2.yaml,
# config/mechanism3.yaml) a round of the per-baseline causal experiment from its runs alone.

REPORT_INPUTS = TARGETS.report_inputs()


rule report:
    input:
        REPORT_INPUTS,
    output:
        report(
            directory(FOLDERS["figures"]),
            patterns=REPORT_PATTERNS,
            caption="../captions/item.rst",
            category=report_category,
        ),
    params:
        config=CONFIG_FILE,
    log:
        f"{LOGS}/report.log",
    benchmark:
        bench("report")
    threads: threads("report")
    resources:
        **res("report"),
    conda:
        "../envs/mwm.yaml"
    shell:
        "python -m mwm.report --config {params.config:q} --out {output:q} > {log:q} 2>&1"
