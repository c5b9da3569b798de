"""Training one run: the model, the loop (``python -m mwm.train``), its schedule, the ranks it starts
and what it logs."""
