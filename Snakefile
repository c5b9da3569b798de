# Rebuild of "Different Layers, Different Manifolds" (module-wise Manifold Muon).
#   snakemake --cores 2 all                           embedded default (config/config.yaml)
#   snakemake --cores 2 --configfile config/ci.yaml   reduced config
#   snakemake --profile slurm all                     paper scale on a SLURM GPU cluster
from snakemake.utils import min_version

min_version("8.0")

if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "captions/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/studies.smk"
include: "rules/train.smk"
include: "rules/report.smk"


rule all:
    input:
        TARGETS.all(FOREIGN.targets()),


# One target per kind of product (mwm.workflow.stages.PRODUCTS): what each DVC stage runs, and handy alone
# (`snakemake --cores 2 runs`).
rule data:
    input:
        DATA_FILES,
    localrule: True


rule runs:
    input:
        TARGETS.runs(FOREIGN.targets()),
    localrule: True


rule studies:
    input:
        study_outputs(*REPORT_STUDIES),
    localrule: True


rule figures:
    input:
        TARGETS.all(FOREIGN.targets()),
    localrule: True
