"""How many DDP ranks train one run, and the micro-batches each accumulates: the config's policy,
read by the workflow before any job (a bad combination refused there) and by the launcher."""

from __future__ import annotations

from mwm.config import ConfigError

__all__ = ["ranks_per_run", "accum_per_rank"]


def ranks_per_run(cfg: dict) -> int:
    """Processes (DDP ranks) per training run of ``cfg``."""
    wf = cfg["workflow"]
    gpu = wf["resources"]["train"]["gpu"]
    ranks = wf.get("ranks_per_run")
    if ranks is None:
        ranks = max(gpu, 1)
    elif gpu > 0 and ranks != gpu:
        raise ConfigError(f"workflow.ranks_per_run={ranks} but workflow.resources.train.gpu={gpu}: "
                          "a run has one rank per GPU (leave ranks_per_run null to follow gpu)")
    accum_per_rank(cfg["train"], ranks)
    return ranks


def accum_per_rank(train: dict, world: int) -> int:
    """Micro-batches each of ``world`` ranks accumulates per step. ``train.grad_accum`` counts them over
    all ranks, as the released train.py divides it by the world size: a config trains the same run, with
    the same tokens per step, on one rank or several."""
    accum = train["grad_accum"]
    if accum % world:
        raise ConfigError(
            f"train.grad_accum={accum} is the step's micro-batches over all ranks and must be a multiple of the "
            f"{world} ranks of a run (each takes grad_accum / ranks); for the same tokens per step on {world} ranks "
            f"set grad_accum to a multiple of {world} and divide batch_size by the same factor")
    return accum // world
