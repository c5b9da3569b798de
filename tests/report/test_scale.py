"""mwm.report.scale: what a config can rebuild, read from the config alone."""

from pathlib import Path

from mwm.config import load_config
from mwm.report.scale import LONG_MIN_ITERS, capabilities, is_paper_scale

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_paper_config_is_paper_scale():
    paper_cfg = load_config(ROOT / "config" / "paper.yaml")
    assert is_paper_scale(paper_cfg) and {"paper", "long"} <= capabilities(paper_cfg)
    default = load_config(ROOT / "config" / "config.yaml")
    assert not is_paper_scale(default) and "paper" not in capabilities(default)


def test_long_follows_the_step_count_and_control_the_precisions():
    cfg = load_config(ROOT / "config" / "config.yaml")
    cfg["train"]["max_iters"] = LONG_MIN_ITERS - 1
    assert "long" not in capabilities(cfg)
    cfg["train"]["max_iters"] = LONG_MIN_ITERS
    assert "long" in capabilities(cfg)
    cfg["studies"]["precisions"] = ["bfloat16", "float32"]
    assert "control" in capabilities(cfg)
    cfg["studies"]["precisions"] = ["float32", "bfloat16"]  # the faithful precision must come first
    assert "control" not in capabilities(cfg)
