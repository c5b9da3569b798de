"""Which optimizer and manifold each parameter of a GPT-2 gets.

The hidden matrices are the 2-D weights of ``attn.c_attn``, ``attn.c_proj``
(attention) and ``mlp.c_fc``, ``mlp.c_proj`` (MLP); they go to Muon. Everything
else (embeddings, the tied LM head, LayerNorm gains, biases) goes to AdamW, as
in the paper's code.

Named assignments: :data:`mwm.optim.vocab.NAMED_ASSIGNMENTS` (Table 3 of the paper, plus
``oblique`` and ``adamw``).

A user mapping is an ordered ``{glob pattern: manifold}`` dict matched against
the full parameter names of the hidden matrices (first match wins; unmatched
hidden matrices get ``none``), so per-layer or per-matrix assignment is one
config entry, e.g. ``{"transformer.h.0.attn.*": "stiefel", "*.mlp.*": "dgram"}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

import torch

from mwm.optim.muon import MUON_MANIFOLDS, ManifoldMuon
from mwm.optim.solvers import SolverSettings
from mwm.optim.vocab import ADAMW, ATTN_KEYS, MLP_KEYS, NAMED_ASSIGNMENTS, NORMALIZE_SCOPES, PAPER_TRAIN, match_patterns

__all__ = [
    "module_kind",
    "layer_of",
    "nonfinite",
    "resolve_assignment",
    "Optimizers",
    "OptimizerSettings",
    "build_optimizers",
]


def module_kind(name: str, p: torch.Tensor) -> str | None:
    """``"attn"`` or ``"mlp"`` for a hidden matrix, ``None`` for anything else."""
    if p.ndim != 2:
        return None
    if any(k in name for k in ATTN_KEYS):
        return "attn"
    if any(k in name for k in MLP_KEYS):
        return "mlp"
    return None


def layer_of(name: str) -> int:
    """The block index of a parameter named ``...h.<i>....`` (nanoGPT's naming), -1 outside the blocks."""
    parts = name.split(".")
    for a, b in zip(parts, parts[1:]):
        if a == "h" and b.isdigit():
            return int(b)
    return -1


def resolve_assignment(
    named_params: Mapping[str, torch.Tensor] | list[tuple[str, torch.Tensor]],
    assignment: str | Mapping[str, str],
) -> dict[str, str]:
    """Map every trainable parameter name to ``"adamw"`` or a Muon manifold.

    Raises ``ValueError`` listing the choices for an unknown name or manifold,
    and naming any pattern that matches no hidden matrix.
    """
    items = list(named_params.items() if isinstance(named_params, Mapping) else named_params)
    items = [(n, p) for n, p in items if p.requires_grad]
    out: dict[str, str] = {}
    if isinstance(assignment, str):
        if assignment not in NAMED_ASSIGNMENTS:
            raise ValueError(
                f"unknown assignment {assignment!r}; choose one of {', '.join(NAMED_ASSIGNMENTS)} "
                "or give a mapping from parameter-name patterns to manifolds"
            )
        pair = NAMED_ASSIGNMENTS[assignment]
        for n, p in items:
            kind = module_kind(n, p)
            if pair is None or kind is None:
                out[n] = ADAMW
            else:
                out[n] = pair[0] if kind == "attn" else pair[1]
        return out

    if not isinstance(assignment, Mapping) or not assignment:
        raise ValueError(f"assignment must be a name or a non-empty pattern mapping, got {assignment!r}")
    for pat, mf in assignment.items():
        if mf not in MUON_MANIFOLDS:
            raise ValueError(
                f"assignment pattern {pat!r}: unknown manifold {mf!r}; choose one of {', '.join(MUON_MANIFOLDS)}"
            )
    hidden = match_patterns([n for n, p in items if module_kind(n, p) is not None], assignment)
    return {n: hidden.get(n, ADAMW) for n, p in items}


def nonfinite(named: list[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the tensors whose squared Frobenius norm is not finite (NaN, Inf, or
    values so large it overflows), from one stacked read (one host-device sync)."""
    if not named:
        return []
    ok = torch.isfinite(torch.stack([t.float().square().sum() for _, t in named]))
    if bool(ok.all()):
        return []
    return [n for (n, _), good in zip(named, ok.tolist()) if not good]


@dataclass
class Optimizers:
    """The Muon optimizer (``None`` for all-AdamW) and the AdamW optimizer. Their learning rates have one
    route: :meth:`set_lr`, which the schedule calls before every step; a step before any rate was set is
    refused rather than taken at a rate nobody chose."""

    muon: ManifoldMuon | None
    adamw: torch.optim.AdamW
    assignment: dict[str, str]
    #: (name, parameter) pairs, to name parameters in errors
    _named: list = ()
    _rated: bool = False

    def all(self) -> list[torch.optim.Optimizer]:
        return [o for o in (self.adamw, self.muon) if o is not None]

    def zero_grad(self) -> None:
        for o in self.all():
            o.zero_grad(set_to_none=True)

    def step(self, inputs: bool = False, directions: dict | None = None) -> dict | None:
        """Both steps; with ``inputs``, returns what the Muon updates consumed,
        ``{name: (manifold, W, U)}`` (:meth:`ManifoldMuon.step_with_inputs`, which also fills
        ``directions`` with each one's step direction; empty without Muon matrices), else None.
        Non-finite values raise ``FloatingPointError`` where they first
        show: AdamW's gradients (checked before anything is written), Muon's gradients,
        momentum and weights (see :class:`ManifoldMuon`), and AdamW's new weights
        (NaN, Inf, or a squared norm that overflows: a weight decay factor
        ``1 - lr wd`` below -1 grows them geometrically), so nothing downstream
        (evaluation, spectral logging) ever sees a diverged weight unannounced."""
        if not self._rated:
            raise RuntimeError("set_lr(adamw_lr, muon_lr) before the first step: the schedule sets the rates")
        self._check(self.adamw, "grad", "gradient has NaN, Inf or overflowing values; no parameter was updated")
        consumed = {} if inputs else None
        if self.muon is not None:
            if inputs:
                consumed = self.muon.step_with_inputs(directions)
            else:
                self.muon.step()
        self.adamw.step()
        self._check(self.adamw, "weight", "AdamW step left NaN, Inf or overflowing values")
        return consumed

    def _check(self, opt: torch.optim.Optimizer, what: str, msg: str) -> None:
        mine = {id(p) for g in opt.param_groups for p in g["params"]}
        items = [(n, p.grad if what == "grad" else p) for n, p in self._named if id(p) in mine]
        bad = nonfinite([(n, t) for n, t in items if t is not None])
        if bad:
            raise FloatingPointError(f"AdamW {what} of [{', '.join(bad)}]: {msg}")

    def follow(self, model: torch.nn.Module) -> None:
        """Hold ``model``'s parameters as they are now: after ``model.to(device)``, which
        may replace the parameter objects (the optimizers are built on the CPU, where the
        manifold init runs, before the move). Only before the first step: no state yet."""
        if any(o.state for o in self.all()):
            raise RuntimeError("optimizers with state cannot follow a moved model")
        now = dict(model.named_parameters())
        moved = {id(p): now[n] for n, p in self._named}
        for o in self.all():
            for g in o.param_groups:
                g["params"] = [moved[id(p)] for p in g["params"]]
        self._named = [(n, now[n]) for n, _ in self._named]

    def set_lr(self, adamw_lr: float, muon_lr: float) -> None:
        """Both rates, for the steps until the next call (the schedule's at each step)."""
        self._rated = True
        for g in self.adamw.param_groups:
            g["lr"] = adamw_lr
        if self.muon is not None:
            for g in self.muon.param_groups:
                g["lr"] = muon_lr

    def state_dict(self) -> dict:
        return {
            "adamw": self.adamw.state_dict(),
            "muon": None if self.muon is None else self.muon.state_dict(),
        }

    def load_state_dict(self, sd: dict) -> None:
        self.adamw.load_state_dict(sd["adamw"])
        if (self.muon is None) != (sd["muon"] is None):
            raise ValueError("checkpoint and run disagree on whether a Muon optimizer exists")
        if self.muon is not None:
            self.muon.load_state_dict(sd["muon"])


@dataclass(frozen=True)
class OptimizerSettings:
    """Both optimizers' settings, built once from a config's ``train`` section (:meth:`from_train`; the
    schema is the one home of the defaults, :meth:`defaults`), as :class:`~mwm.optim.solvers.SolverSettings`
    is for the inner solve; not the learning rates, which are the schedule's (:meth:`Optimizers.set_lr`).
    ``attn_sigma_cap`` / ``mlp_sigma_cap``: the DGram attention (MLP) weights
    get a group of their own whose singular values are capped after every retraction (None: no cap, as
    in the paper); ``solver_normalize``: ``all``, ``attn`` or ``mlp``, the modules whose constrained
    weights get the scale-normalized inner solve (None: the paper's)."""

    betas: tuple[float, float]
    weight_decay: float
    momentum: float
    dgram_retraction: str
    solver: SolverSettings
    attn_sigma_cap: float | None = None
    mlp_sigma_cap: float | None = None
    solver_normalize: str | None = None
    dgram_polar: str | None = None

    @classmethod
    def from_train(cls, train: Mapping, retraction: str | None = None) -> "OptimizerSettings":
        """The settings a (validated) ``train`` section gives; ``retraction`` overrides its
        ``dgram_retraction`` (a ``-colnorm`` variant)."""
        return cls(betas=(train["beta1"], train["beta2"]), weight_decay=train["weight_decay"],
                   momentum=train["muon_momentum"],
                   dgram_retraction=retraction or train["dgram_retraction"], solver=SolverSettings.from_train(train),
                   attn_sigma_cap=train.get("attn_sigma_cap"), mlp_sigma_cap=train.get("mlp_sigma_cap"),
                   solver_normalize=train.get("solver_normalize"), dgram_polar=train.get("dgram_polar"))

    @classmethod
    def defaults(cls, **changes) -> "OptimizerSettings":
        """The paper's settings (:data:`~mwm.optim.vocab.PAPER_TRAIN`, the schema's defaults), with ``changes``."""
        return dataclasses.replace(cls.from_train(PAPER_TRAIN), **changes)


def build_optimizers(
    model: torch.nn.Module,
    assignment: str | Mapping[str, str],
    settings: OptimizerSettings | None = None,
    *,
    init_on_manifold: bool = True,
) -> Optimizers:
    """Split ``model``'s parameters as the paper does and build both optimizers.

    AdamW: 2-D non-hidden weights with ``weight_decay``, the rest without.
    Muon: one group per manifold; plain Muon gets ``weight_decay``, the
    constrained groups get none (it would push them off the manifold).
    ``settings``: :class:`OptimizerSettings` (None: the paper's, :meth:`OptimizerSettings.defaults`).
    """
    s = OptimizerSettings.defaults() if settings is None else settings
    weight_decay, solver_normalize = s.weight_decay, s.solver_normalize
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    plan = resolve_assignment(named, assignment)
    decay, no_decay = [], []
    caps = {"attn": s.attn_sigma_cap, "mlp": s.mlp_sigma_cap}
    for kind, cap in caps.items():
        if cap is not None and not cap > 0:
            raise ValueError(f"{kind}_sigma_cap must be > 0 (or None), got {cap!r}")
    if solver_normalize is not None and solver_normalize not in NORMALIZE_SCOPES:
        raise ValueError(f"unknown solver_normalize {solver_normalize!r}; choose one of {', '.join(NORMALIZE_SCOPES)}")
    scope = NORMALIZE_SCOPES.get(solver_normalize, ())
    # group key: (manifold, the module kind whose cap the group carries or "", normalized solve)
    muon_groups: dict[tuple[str, str, bool], tuple[list, list]] = {}
    for n, p in named:
        target = plan[n]
        if target == ADAMW:
            (decay if p.ndim >= 2 else no_decay).append(p)
        else:
            kind = module_kind(n, p)
            capped = kind if caps[kind] is not None and target == "dgram" else ""
            normalized = kind in scope and target != "none"
            names, params = muon_groups.setdefault((target, capped, normalized), ([], []))
            names.append(n)
            params.append(p)
    adamw_groups = [g for g in ({"params": decay, "weight_decay": weight_decay},
                                {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    # No rate here: Optimizers.set_lr is its one route (the schedule's, train.learning_rate and train.muon_lr).
    adamw = torch.optim.AdamW(adamw_groups, lr=0.0, betas=s.betas)
    muon = None
    if muon_groups:
        groups = [
            {"params": params, "names": names, "manifold": mf,
             "weight_decay": weight_decay if mf == "none" else 0.0,
             **({"sigma_cap": float(caps[capped])} if capped else {}),
             **({"solver_normalize": True} if normalized else {})}
            for (mf, capped, normalized), (names, params) in sorted(muon_groups.items())
        ]
        muon = ManifoldMuon(groups, lr=0.0, momentum=s.momentum, dgram_retraction=s.dgram_retraction,
                            dgram_polar=s.dgram_polar, init_on_manifold=init_on_manifold, solver=s.solver)
    return Optimizers(muon=muon, adamw=adamw, assignment=plan, _named=named)
