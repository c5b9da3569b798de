"""What a config can rebuild: its scale (the paper's, ``long`` or smaller) and the studies' protocols,
as the ``needs`` of :class:`mwm.paper.Rule` read them. Shared by the ledger and the experiment reports
that judge their own rows."""

from __future__ import annotations

from mwm import paper

__all__ = ["LONG_MIN_ITERS", "is_paper_scale", "capabilities"]

#: a run at least this long counts as the ``long`` scale (config/long.yaml)
LONG_MIN_ITERS = 2000


def is_paper_scale(cfg: dict) -> bool:
    m, t, d = cfg["model"], cfg["train"], cfg["data"]
    return (m.get("size") == "gpt2" and d.get("corpus") == "openwebtext" and t["max_iters"] >= paper.STEPS
            and len(cfg["grid"]["seeds"]) >= 1)


def capabilities(cfg: dict) -> set[str]:
    """What this config can rebuild (the ``needs`` of :class:`mwm.paper.Rule`)."""
    caps = {"any"}
    if is_paper_scale(cfg):
        caps |= {"paper", "long"}
    elif cfg["train"]["max_iters"] >= LONG_MIN_ITERS:
        caps.add("long")
    st = cfg.get("studies") or {}
    sa = st.get("alpha") or {}
    sizes = set(sa.get("sizes") or [])
    if sa.get("iterations") == 100:  # the paper's alpha numbers are after 100 iterations
        caps |= {f"n={n}" for n in sizes}
        if any(n >= 512 for n in sizes):
            caps.add("n>=512")
        if sizes and min(sizes) <= 32 and max(sizes) >= 768:
            caps.add("alpha-range")
    ab = st.get("absorption") or {}
    if (ab.get("reference_iterations") == 200 and ab.get("report_T") == 20 and ab.get("eta") == 0.1
            and ab.get("alpha") == 0.1 and list(ab.get("flatness_T") or []) == [5, 100]):
        caps.add("absorption-protocol")
    if (cfg.get("grid") or {}).get("sweep"):
        caps.add("sweep" if cfg["workflow"]["report"] == "sweep" else cfg["workflow"]["report"])
    precs = list(st.get("precisions") or [])
    if precs[:1] == ["bfloat16"] and "float32" in precs[1:]:
        caps.add("control")
    return caps
