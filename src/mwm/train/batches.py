"""What a run reads: the dataset of its config, the model's shape over its vocabulary, the seeded
training windows (:class:`Sampler`, whose state checkpoints) and the fixed evaluation batches."""

from __future__ import annotations

import numpy as np
import torch

from mwm.config import ConfigError
from mwm.train.model import SIZES, GPTConfig

__all__ = ["resolve_data", "build_model_config", "Sampler", "FixedBatches"]


def resolve_data(cfg: dict):
    """The TokenDataset of the config's data section."""
    from mwm.data import TokenDataset, dataset_dir

    folder = dataset_dir(cfg["data"])
    if not (folder / "meta.json").exists():
        raise ConfigError(f"data folder {folder} has no meta.json; run `python -m mwm.data prepare --config ...` first")
    ds = TokenDataset(folder)
    if ds.verify_cached():  # checksums and id range, once per data folder (cached)
        print(f"verified {folder}: checksums and token ids", flush=True)
    return ds


def build_model_config(cfg: dict, data_vocab: int) -> GPTConfig:
    m = dict(cfg["model"])
    shape = SIZES[m["size"]] if m["size"] else {k: m[k] for k in ("n_layer", "n_head", "n_embd")}
    vocab = m["vocab_size"]
    if vocab is None:
        vocab = data_vocab
    elif vocab < data_vocab:
        raise ConfigError(f"model.vocab_size={vocab} is smaller than the dataset's vocab size {data_vocab}")
    # train.attn_qk_scale changes the attention forward (the saturation-only intervention); absent: None
    return GPTConfig(vocab_size=vocab, block_size=m["block_size"], bias=m["bias"], dropout=m["dropout"],
                     qk_scale=cfg["train"].get("attn_qk_scale"), **shape)


class Sampler:
    """Random windows of a token array, from one seeded generator (its state checkpoints)."""

    def __init__(self, data: np.ndarray, block: int, seed: int):
        if len(data) <= block + 1:
            raise ConfigError(f"split has {len(data)} tokens, fewer than block_size + 2 = {block + 2}")
        self.data, self.block = data, block
        self.gen = torch.Generator().manual_seed(seed)

    def indices(self, n: int) -> torch.Tensor:
        return torch.randint(len(self.data) - self.block - 1, (n,), generator=self.gen)

    def batch(self, ix: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows at ``ix`` as (input, target) on ``device``; to a GPU from pinned
        memory without blocking (as the released code), so the host runs ahead."""
        rows = np.stack([np.asarray(self.data[i:i + self.block + 1], dtype=np.int64) for i in ix.tolist()])
        t = torch.from_numpy(rows)
        x, y = t[:, :-1].contiguous(), t[:, 1:].contiguous()
        if torch.device(device).type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)


class FixedBatches:
    """The evaluation batches (``eval_iters`` x ``batch_size`` windows of each split) and
    the attention probe batch, drawn from ``eval_seed``: the same for every run of a config."""

    def __init__(self, data, block: int, tc: dict, device: torch.device):
        self.device = device
        gen = torch.Generator().manual_seed(tc["eval_seed"])
        splits = {s: data.split(s) for s in ("train", "val")}
        self.ix: dict[str, torch.Tensor] = {}
        for split, arr in splits.items():
            if len(arr) <= block + 1:
                raise ConfigError(f"{split} split has {len(arr)} tokens, fewer than block_size + 2 = {block + 2}")
            self.ix[split] = torch.randint(len(arr) - block - 1, (tc["eval_iters"], tc["batch_size"]), generator=gen)
        self.samplers = {s: Sampler(arr, block, 0) for s, arr in splits.items()}
        probe_ix = torch.randint(len(splits["val"]) - block - 1, (tc["probe_batch"],), generator=gen)
        self.probe = self.samplers["val"].batch(probe_ix, device)[0]

    @torch.no_grad()
    def losses(self, model: torch.nn.Module, autocast) -> dict[str, float]:
        """Mean loss of ``model`` over each split's batches."""
        model.eval()
        out = {}
        for split, ix in self.ix.items():
            tot = torch.zeros((), dtype=torch.float64, device=self.device)
            for b in ix:
                x, y = self.samplers[split].batch(b, self.device)
                with autocast:
                    _, loss = model(x, y)
                tot += loss.double()  # summed on the device, read once per split
            out[split] = tot.item() / len(ix)
        model.train()
        return out
