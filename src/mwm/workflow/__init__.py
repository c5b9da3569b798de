"""The workflow's bookkeeping: where runs live and whose they are, variant expansion, locks, the
stage manifest, SLURM site settings, the DVC pipelines and the status table."""
