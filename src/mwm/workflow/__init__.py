"""The workflow's bookkeeping: whose results a config name's are, the stage manifest, SLURM site
settings, the DVC pipelines, the CPU rehearsal and the status table."""
