"""A stand-in token dataset for training tests (random ids, no tokenizer needed)."""

import numpy as np
import yaml

import mwm.train


class FakeData:
    def __init__(self, vocab=64, n=6000, seed=0):
        r = np.random.default_rng(seed)
        # a learnable pattern plus noise, so the loss moves
        base = np.arange(n) % vocab
        noise = r.integers(0, vocab, n)
        toks = np.where(r.random(n) < 0.7, base, noise)
        self.vocab_size = vocab
        self._s = {"train": toks.astype(np.uint16), "val": toks[: n // 4].astype(np.uint16)}
        self.meta = {"vocab_size": vocab}

    def split(self, s):
        return self._s[s]


def patch():
    mwm.train.resolve_data = lambda cfg: FakeData()


TINY = {
    "name": "tiny",
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 16},
    "train": {"batch_size": 4, "max_iters": 12, "eval_interval": 4, "eval_iters": 2, "checkpoint_interval": 4,
              "dual_ascent_steps": 3, "warmup_iters": 2, "lr_decay_iters": 12, "probe_batch": 2,
              "log_interval": 4},
}


def write_config(path, **overrides):
    cfg = yaml.safe_load(yaml.safe_dump(TINY))
    for key, value in overrides.items():
        section, name = key.split("__")
        cfg.setdefault(section, {})[name] = value
    path.write_text(yaml.safe_dump(cfg))
    return path
