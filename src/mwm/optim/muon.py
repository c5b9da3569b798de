"""The Muon / Manifold Muon optimizer for hidden weight matrices.

Per parameter group (each carries a ``manifold`` key):

* Nesterov momentum as in the released code: ``buf = mu buf + g``,
  ``u = g + mu buf``;
* ``manifold="none"``: plain Muon, ``W <- (1 - lr wd) W - lr msign(u)``;
* ``manifold`` in stiefel / dgram / oblique: Manifold Muon,
  ``W <- retract(W - lr A)`` with ``A`` from the dual ascent; no weight decay.
  A DGram group may carry ``sigma_cap`` (attention or MLP): after the retraction its column norms (its
  singular values, on DGram) are capped there (the intervention of :mod:`mwm.plan.variants`).

Matrices of equal shape (up to transposition: wide ones are stacked in their
tall orientation) and hyperparameters are stacked into one bank and updated by
one batched call; Stiefel and DGram matrices of equal (padded) shape share a bank
(one solve with a per-matrix projector mask, :class:`~mwm.optim.dual_ascent.MixedProjector`),
e.g. a per-layer assignment of one module kind.

Inner solver: one :class:`~mwm.optim.solvers.SolverSettings` (``solver=``; default: the
schema's, the paper's cold-started 20-step dual ascent with alpha 0.1), held in each
param group as plain entries (``SolverSettings.group``) so a group may differ. With
``warm_start`` each matrix starts from its final multiplier of the previous step, kept
as ``state["dual"]`` in the tall orientation and therefore in ``state_dict``. Its
``precision`` (``float32``, or ``bfloat16`` as released) is that of every msign (Muon,
the inner solver, the Stiefel retraction), its ``msign_steps`` their step count.

Values are checked wherever a divergence first shows: the gradients (before
anything is written), the momentum and update direction, the weight before the
retraction and the new weight. NaN, Inf, or a matrix whose squared Frobenius norm
overflows (so its Gram matrix, or msign's normalization, would) raises
``FloatingPointError`` naming the parameters, before any LAPACK call sees the
values; the weights of that bank are left unchanged. With sharded banks every
rank raises together.

The math of a step is two functions, :func:`momentum_direction` and
:func:`muon_update`; the optimizer class does the bookkeeping around them (banks,
state, sharding). :meth:`ManifoldMuon.step_with_inputs` is a step that also returns
what each update consumed, the (W, update direction) pairs the studies use.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch

from mwm.optim.manifolds import DGRAM_RETRACTIONS, MANIFOLDS, cap_column_norms, get_manifold, to_tall
from mwm.optim.msign import msign
from mwm.optim.solvers import SolverSettings, solve
from mwm.optim.vocab import PAPER_TRAIN, POLARS

__all__ = ["ManifoldMuon", "MUON_MANIFOLDS", "momentum_direction", "muon_update"]

#: What a Muon parameter group may ask for: plain Muon or one of the manifolds.
MUON_MANIFOLDS = ("none",) + MANIFOLDS



class ManifoldMuon(torch.optim.Optimizer):
    """Muon with optional manifold constraints, batched over banks of equal shapes.

    Parameter groups may set ``manifold`` (default ``"none"``) and ``names``
    (parameter names, used in error messages). With ``init_on_manifold`` the
    constrained weights are moved onto their manifold at construction.
    """

    def __init__(
        self,
        params,
        lr: float | None = None,
        momentum: float | None = None,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        dgram_retraction: str | None = None,
        dgram_polar: str | None = None,
        manifold: str = "none",
        init_on_manifold: bool = True,
        solver: SolverSettings | None = None,
    ):
        lr = PAPER_TRAIN["muon_lr"] if lr is None else lr
        momentum = PAPER_TRAIN["muon_momentum"] if momentum is None else momentum
        dgram_retraction = PAPER_TRAIN["dgram_retraction"] if dgram_retraction is None else dgram_retraction
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if solver is None:
            solver = SolverSettings.defaults()
        if not isinstance(solver, SolverSettings):
            raise TypeError(f"ManifoldMuon's solver is a SolverSettings, got {type(solver).__name__}")
        defaults = dict(
            lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
            dgram_retraction=dgram_retraction, dgram_polar=dgram_polar, manifold=manifold, names=None,
            **solver.group(),
        )
        super().__init__(params, defaults)
        self._rank, self._world = 0, 1
        for gi, group in enumerate(self.param_groups):
            if group["manifold"] not in MUON_MANIFOLDS:
                raise ValueError(
                    f"param group {gi}: unknown manifold {group['manifold']!r}; "
                    f"choose one of {', '.join(MUON_MANIFOLDS)}"
                )
            if group["dgram_retraction"] not in DGRAM_RETRACTIONS:
                raise ValueError(
                    f"param group {gi}: unknown dgram_retraction {group['dgram_retraction']!r}; "
                    f"choose one of {', '.join(DGRAM_RETRACTIONS)}"
                )
            if group.get("dgram_polar") not in (None, *POLARS):
                raise ValueError(f"param group {gi}: unknown dgram_polar {group['dgram_polar']!r}; "
                                 f"choose one of {', '.join(POLARS)}")
            try:
                SolverSettings.of_group(group)
            except ValueError as exc:
                raise ValueError(f"param group {gi}: {exc}") from None
            names = group["names"]
            if names is not None and len(names) != len(group["params"]):
                raise ValueError(f"param group {gi}: {len(names)} names for {len(group['params'])} params")
            for i, p in enumerate(group["params"]):
                if p.ndim != 2:
                    raise ValueError(
                        f"{self._name(group, i)}: Muon handles 2-D weight matrices only, got shape {tuple(p.shape)}"
                    )
        if init_on_manifold:
            self.init_on_manifold()

    @staticmethod
    def _name(group, i: int) -> str:
        names = group.get("names")
        return names[i] if names else f"param {i} of group ({group['manifold']})"

    @torch.no_grad()
    def init_on_manifold(self) -> None:
        """Move every constrained weight onto its manifold (batched per shape)."""
        for group in self.param_groups:
            if group["manifold"] == "none":
                continue
            mf = get_manifold(group["manifold"], group["dgram_retraction"], group.get("dgram_polar"))
            for params in _banks(group["params"], pad=False).values():
                W = torch.stack([_tall(_work(p)) for p in params])
                for p, w in zip(params, mf.init(W)):
                    p.copy_(_oriented(w, p).to(p.dtype))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._step(None)
        return loss

    @torch.no_grad()
    def step_with_inputs(self, directions: dict | None = None) -> dict[str, tuple[str, torch.Tensor, torch.Tensor]]:
        """:meth:`step`, returning what each update consumed: ``{name: (manifold, W, U)}``
        with ``W`` the weight before the step and ``U`` the update direction (the Nesterov
        momentum), both copies in the parameter's orientation and the optimizer's working
        precision, for the matrices this rank computes (all of them unsharded). With a dict
        ``directions``, each such matrix's step direction ``A`` (the inner solve's, or ``msign(U)``
        for plain Muon; ``W`` moves to ``retract(W - lr A)``) is added to it, oriented alike."""
        inputs: dict = {}
        self._step(inputs, directions)
        return inputs

    def _step(self, inputs: dict | None, directions: dict | None = None) -> None:
        """The bookkeeping of a step: banks, momentum buffers, sharding and broadcasts,
        around :func:`momentum_direction` and :func:`muon_update` (the math). With a dict
        ``inputs``, each computed matrix's ``(manifold, W, U)`` is added to it (and its step
        direction to ``directions``)."""
        self._check_grads()
        pieces = self._pieces(self._plan())
        error = None
        for owner, entries in pieces:
            try:
                self._update_bank(entries, compute=owner == self._rank, inputs=inputs, directions=directions)
            except FloatingPointError as exc:
                if self._world == 1:
                    raise
                error = error or exc  # raise on every rank together, before the broadcasts
        if self._world > 1:
            import torch.distributed as dist

            device = pieces[0][1][0][1].device if pieces else None
            flag = torch.tensor([0.0 if error is None else 1.0], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                raise error or FloatingPointError("another rank found non-finite values in its Muon update; "
                                                  "no weights were updated")
            for owner, entries in pieces:
                params = [p for _, p in entries]
                W = _stack([_tall(p.detach()) for p in params])
                dist.broadcast(W, src=owner)
                for p, w in zip(params, W):
                    p.copy_(_unpad(w, p))
                if entries[0][0]["manifold"] != "none" and entries[0][0]["warm_start"]:
                    for p in params:  # the multipliers travel with their bank's weights
                        if "dual" not in self.state[p]:
                            n = _tall(p).shape[-1]
                            self.state[p]["dual"] = torch.zeros(n, n, dtype=W.dtype, device=W.device)
                    L = torch.stack([self.state[p]["dual"] for p in params])
                    dist.broadcast(L, src=owner)
                    for p, lam in zip(params, L):
                        self.state[p]["dual"].copy_(lam)

    def _check_grads(self) -> None:
        """Refuse bad gradients before any weight or buffer is touched: one flag per
        matrix, stacked and read once (one host-device sync a step, not one a matrix)."""
        live = [(group, i, p) for group in self.param_groups for i, p in enumerate(group["params"])
                if p.grad is not None]
        if not live:
            return
        flags = torch.stack([torch.isfinite(p.grad).all() for _, _, p in live])
        if bool(flags.all()):
            return
        group, i, _ = live[int(flags.logical_not().nonzero()[0, 0])]
        raise FloatingPointError(f"{self._name(group, i)}: gradient has NaN or Inf entries; no parameter was updated")

    def shard(self, rank: int, world: int) -> None:
        """Split the optimizer's work across ``world`` processes: the banks' matrices,
        in bank order, are cut into ``world`` contiguous runs of about equal cost
        (:func:`_split_by_work`; a bank may be cut in two), each rank computes the
        updates of its run and broadcasts the new weights (and warm-start multipliers).
        Gradients must already agree across ranks (DDP); momentum is kept everywhere."""
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside a world of {world}")
        self._rank, self._world = rank, world

    def _plan(self) -> list[list[tuple[dict, torch.Tensor]]]:
        """Banks of ``(group, param)``: per group as :func:`_banks` makes them, and banks
        of Stiefel and DGram groups with equal solver settings, width and (padded) height
        merged into one."""
        banks: dict[tuple, list] = {}
        for gi, group in enumerate(self.param_groups):
            live = [p for p in group["params"] if p.grad is not None]
            if not live:
                continue
            if group["manifold"] in _MIXABLE:
                solve_key = ("mixed",) + tuple(
                    (k, v) for k, v in sorted(group.items()) if k not in ("params", "names", "manifold"))
            else:
                solve_key = ("group", gi)
            for shape_key, params in _banks(live).items():
                # merged only at equal padded height: more padding would cost more flops than
                # the saved calls (hetero on the mini model: attention 192 rows, MLP 256)
                height = max(_tall(p).shape[-2] for p in params)
                banks.setdefault((solve_key, shape_key, height), []).extend((group, p) for p in params)
        return list(banks.values())

    def _pieces(self, banks) -> list[tuple[int, list]]:
        """``(owner rank, entries)`` per bank, or per part of a bank cut between ranks."""
        if self._world == 1:
            return [(0, entries) for entries in banks]
        costs = []
        for entries in banks:
            group = entries[0][0]
            m = max(_tall(p).shape[-2] for _, p in entries)
            n = _tall(entries[0][1]).shape[-1]
            per = m * n * n * (1 if group["manifold"] == "none" else group["dual_steps"])
            costs.append([per] * len(entries))
        owners = _split_by_work([c for bank in costs for c in bank], self._world)
        pieces, k = [], 0
        for entries in banks:
            start = 0
            for i in range(1, len(entries) + 1):
                if i == len(entries) or owners[k + i] != owners[k + start]:
                    pieces.append((owners[k + start], entries[start:i]))
                    start = i
            k += len(entries)
        return pieces

    def _update_bank(self, entries: list[tuple[dict, torch.Tensor]], compute: bool = True,
                     inputs: dict | None = None, directions: dict | None = None) -> None:
        group = entries[0][0]
        params = [p for _, p in entries]
        grads = _stack([_tall(_work(p.grad)) for p in params])
        bufs = []
        for p, g in zip(params, grads):
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, dtype=g.dtype)
            bufs.append(state["momentum_buffer"])
        buf, update_dir = momentum_direction(grads, _stack([_tall(b) for b in bufs]), group["momentum"],
                                             group["nesterov"])
        self._check(entries, update_dir, "momentum / update direction")
        for b, new in zip(bufs, buf):
            b.copy_(_unpad(new, b))
        if not compute:
            return  # another rank computes this bank's update and broadcasts it
        W = _stack([_tall(_work(p)) for p in params])
        manifolds = [g["manifold"] for g, _ in entries]
        if inputs is not None:
            for (g, p), w, u in zip(entries, W, update_dir):
                i = next(j for j, q in enumerate(g["params"]) if q is p)
                inputs[self._name(g, i)] = (g["manifold"], _unpad(w, p).clone(), _unpad(u, p).clone())
        Lambda0 = None
        if group["manifold"] != "none" and group["warm_start"] and all("dual" in self.state[p] for p in params):
            Lambda0 = torch.stack([self.state[p]["dual"] for p in params]).to(W.dtype)
        W, duals, A = muon_update(W, update_dir, group, manifolds, Lambda0,
                                  check=lambda X, what: self._check(entries, X, what))
        if directions is not None:
            for (g, p), a in zip(entries, A):
                i = next(j for j, q in enumerate(g["params"]) if q is p)
                directions[self._name(g, i)] = _unpad(a, p).clone()
        self._check(entries, W, "updated weight")
        for p, w in zip(params, W):
            p.copy_(_unpad(w, p).to(p.dtype))
        if duals is not None:
            for p, lam in zip(params, duals):
                self.state[p]["dual"] = lam.clone()

    def _check(self, entries, X: torch.Tensor, what: str) -> None:
        """Raise FloatingPointError unless every matrix of the bank ``X`` has a finite
        squared Frobenius norm: that excludes NaN and Inf, and values so large that a
        Gram matrix or a norm of them overflows (every Gram entry is at most it)."""
        if bool(torch.isfinite(X.square().sum(dim=(-2, -1))).all()):
            return
        names = ", ".join(self._name(g, next(j for j, q in enumerate(g["params"]) if q is p)) for g, p in entries)
        raise FloatingPointError(f"{what} of [{names}] is not finite (NaN, Inf or overflowing norm); "
                                 "these weights were left unchanged")


def momentum_direction(grads: torch.Tensor, buf: torch.Tensor, mu: float, nesterov: bool = True
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Momentum of a bank: ``buf <- mu buf + g`` (in place on ``buf``) and the update
    direction ``g + mu buf`` (Nesterov) or ``buf``; returns ``(buf, direction)``."""
    buf.mul_(mu).add_(grads)
    return buf, (grads.add(buf, alpha=mu) if nesterov else buf)


def muon_update(W: torch.Tensor, U: torch.Tensor, group: dict, manifolds: list[str],
                Lambda0: torch.Tensor | None = None, check=None
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One (Manifold) Muon step of a bank ``W`` (tall, stacked; plain Muon updates it in
    place) along the update direction ``U``, with the settings of ``group`` (lr, weight
    decay, solver, msign, retraction) and each matrix's manifold in ``manifolds``.
    Returns the new weights, with ``group["warm_start"]`` the inner solver's final
    multipliers (else None), and the step direction ``A`` (``W - lr A`` before the
    retraction). ``check(X, what)`` may refuse an intermediate value (the weight before
    the retraction, the multipliers) by raising."""
    lr = group["lr"]
    settings = SolverSettings.of_group(group)
    if group["manifold"] == "none":
        if group["weight_decay"]:
            W.mul_(1.0 - lr * group["weight_decay"])
        A = msign(U, steps=settings.msign_steps, precision=settings.precision)
        W.add_(A, alpha=-lr)
        return W, None, A
    kinds = sorted(set(manifolds))
    res = solve(W, U, kinds[0] if len(kinds) == 1 else manifolds, settings, Lambda0=Lambda0)
    pre = W - lr * res.A
    if check is not None:
        check(pre, "weight before the retraction")
    prec = settings.precision
    # .get: an older checkpoint's param groups, which replace these on load, lack the key (the default solve)
    retraction, polar = group["dgram_retraction"], group.get("dgram_polar")
    if len(kinds) == 1:
        W = get_manifold(kinds[0], retraction, polar).retract(pre, precision=prec)
    else:
        W = torch.empty_like(pre)
        for name in kinds:
            idx = _index_of(tuple(manifolds), name, pre.device)
            W[idx] = get_manifold(name, retraction, polar).retract(pre[idx], precision=prec)
    cap = group.get("sigma_cap")
    if cap is not None:  # a group of DGram attention or MLP weights under an intervention's cap (mwm.plan.variants)
        W = cap_column_norms(W, cap)
    if not settings.warm_start:
        return W, None, res.A
    if check is not None:
        check(res.Lambda, "inner-solver multiplier")
    return W, res.Lambda, res.A


@functools.lru_cache(maxsize=256)
def _index_of(manifolds: tuple[str, ...], name: str, device: torch.device) -> torch.Tensor:
    """The positions of ``name`` in a mixed bank's ``manifolds``, as an index tensor on
    ``device``, made once per bank layout (not copied to the device at every step)."""
    return torch.tensor([i for i, k in enumerate(manifolds) if k == name], device=device)


#: Manifolds whose projectors mix in one batched solve (:class:`~mwm.optim.dual_ascent.MixedProjector`).
_MIXABLE = ("stiefel", "dgram")


def _split_by_work(costs: list[float], world: int) -> list[int]:
    """Owner rank of each item of an ordered list: ``world`` contiguous runs, each cut
    where the running cost passes the next multiple of ``total / world`` (an item goes
    to the rank in whose share its cost's midpoint falls)."""
    total = float(sum(costs))
    owners, acc = [], 0.0
    for c in costs:
        mid = acc + c / 2.0
        owners.append(min(world - 1, int(mid * world / total)) if total > 0 else 0)
        acc += c
    return owners


def _work(t: torch.Tensor) -> torch.Tensor:
    """The optimizer's working precision: float32 for half-precision tensors, else as is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _tall(t: torch.Tensor) -> torch.Tensor:
    """A view of a 2-D matrix in its tall orientation (every solver works there)."""
    return to_tall(t)[0]


def _oriented(tall: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``tall`` back in the orientation of the parameter ``like``."""
    return tall.mT if like.shape[-2] < like.shape[-1] else tall


#: Matrices with at most this many entries are banked by width alone, zero-padded to
#: the bank's tallest height. Padding rows with zeros changes nothing in the math (the
#: padded rows of M, A and the retraction stay 0), and small matrices pay more per call
#: than per flop, so one padded bank beats several exact-shape ones (docs/measured.md).
#: Larger matrices keep exact-shape banks, where padding would cost flops.
PAD_MAX_ENTRIES = 1 << 16


def _banks(params, pad: bool = True) -> dict[tuple, list[torch.Tensor]]:
    """Banks of matrices with equal tall shapes (``c_fc`` and the transposed MLP
    ``c_proj`` of a GPT-2 block share one), dtype and device; with ``pad``, small
    matrices of equal width share one bank whatever their height."""
    banks: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        m, n = _tall(p).shape
        shape = ("width", n) if pad and m * n <= PAD_MAX_ENTRIES else ("shape", m, n)
        banks[(shape, p.dtype, p.device)].append(p)
    return banks


def _stack(tall: list[torch.Tensor]) -> torch.Tensor:
    """Stack tall matrices of equal width, zero-padding each to the tallest height."""
    m = max(t.shape[-2] for t in tall)
    if all(t.shape[-2] == m for t in tall):
        return torch.stack(tall)
    out = tall[0].new_zeros((len(tall), m, tall[0].shape[-1]))
    for i, t in enumerate(tall):
        out[i, : t.shape[-2]] = t
    return out


def _unpad(tall: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The rows of a stacked (possibly padded) matrix that belong to parameter
    ``like``, in ``like``'s orientation."""
    return _oriented(tall[: _tall(like).shape[-2]], like)
