"""The run plan, torch-free: which runs a config makes, with which settings, identity and folders
(:mod:`mwm.plan.runs`), what a grid name stands for (:mod:`mwm.plan.variants`) and what the config
alone tells about them before any job (:mod:`mwm.plan.checks`)."""
