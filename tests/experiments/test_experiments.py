"""The experiments (mwm.experiments): one module each, read by the schema, the stage manifest, the plan, the
report and the claims; a new round is its module alone (plus its config)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mwm import paper
from mwm.config import ConfigError, load_config
from mwm.config.names import REPORTS
from mwm.experiments import EXPERIMENTS, Experiment
from mwm.report import builders
from mwm.workflow.stages import REPORT_INPUTS, STUDIES

ROOT = Path(__file__).resolve().parents[2]


def test_every_experiment_module_is_read_by_the_schema_the_stages_and_the_report():
    modules = {p.stem for p in (ROOT / "src" / "mwm" / "experiments").glob("*.py") if not p.stem.startswith("_")}
    assert set(EXPERIMENTS) == modules == set(REPORTS) == set(REPORT_INPUTS)
    for name, e in EXPERIMENTS.items():
        assert set(e.studies) <= set(STUDIES), name
        assert REPORT_INPUTS[name] == (e.studies, e.reads_runs)
        fn = e.builder()
        assert callable(fn) and fn.__module__ == builders.__name__, name
    with pytest.raises(ConfigError, match="workflow.report"):
        load_config(ROOT / "config" / "ci.yaml", ['workflow.report="ablation"'])


def test_each_round_is_declared_in_its_module_and_gets_its_rules():
    rounds = {name: e.round for name, e in EXPERIMENTS.items() if e.round is not None}
    assert rounds == paper.ROUNDS and set(rounds) >= {"mechanism2", "mechanism3"}
    for name, rnd in rounds.items():
        rows = [c for c in paper.CLAIMS if c.id.startswith(f"{rnd.prefix}.")]
        kinds = {c.id.split(".")[1] for c in rows}
        assert kinds == {"fails", "cause", *(f"{k}_restores" for k in rnd.kinds)}, name
        assert all(c.rule.needs == name and c.rule.min_seeds == rnd.min_seeds and c.rebuild == rnd.rebuild
                   for c in rows)
        assert set(rnd.primary) <= set(rnd.kinds) and set(rnd.arms) >= set(rnd.kinds)


def test_a_module_that_declares_no_experiment_or_a_foreign_round_is_refused(tmp_path):
    (tmp_path / "stray.py").write_text("X = 1\n")
    out = _with_modules(tmp_path, "import mwm.experiments")
    assert out.returncode != 0 and "mwm.experiments.stray declares no EXPERIMENT" in out.stderr
    (tmp_path / "stray.py").unlink()
    (tmp_path / "roundx.py").write_text(textwrap.dedent("""
        from mwm.experiments import Experiment
        from mwm.experiments.mechanism3 import ROUND
        EXPERIMENT = Experiment((), True, "a copy", "mwm.report.builders:mechanism_round", ROUND)
    """))
    out = _with_modules(tmp_path, "import mwm.paper")  # a round under two names: its rows twice
    assert out.returncode != 0 and "claim ids must be unique" in out.stderr


def _with_modules(folder: Path, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter whose mwm.experiments package also holds the modules in ``folder``
    (what a new experiment's file does, without writing into the package)."""
    prelude = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.find_spec("mwm.experiments")
        mod = importlib.util.module_from_spec(spec)
        mod.__path__.append({str(folder)!r})
        sys.modules["mwm.experiments"] = mod
        spec.loader.exec_module(mod)
    """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120)


def test_a_new_round_is_its_module_alone(tmp_path):
    """A fourth round written as one module: the schema accepts its name, the stage manifest and the plan read
    its inputs, the paper writes its pre-registered rows from its declaration, and its report's builder is the
    rounds' own, with no other file touched."""
    (tmp_path / "mechanism9.py").write_text(textwrap.dedent("""
        from mwm.experiments import Experiment, MechRound
        ROUND = MechRound(prefix="mech9", rebuild="config/mechanism9.yaml", rates=(20.48,),
                          min_seeds=16, kinds=("solver", "saturation"), primary=("saturation",),
                          per_kind_check=True, arms={"solver": "a solve", "saturation": "unit queries and keys"})
        EXPERIMENT = Experiment((), True, "a ninth round", "mwm.report.builders:mechanism_round", ROUND)
    """))
    out = _with_modules(tmp_path, f"""
        from mwm import paper
        from mwm.config import load_config
        from mwm.config.names import REPORTS
        from mwm.plan.runs import Plan
        from mwm.workflow.stages import REPORT_INPUTS
        from mwm.report.mechanism2 import round_of
        assert "mechanism9" in REPORTS and REPORT_INPUTS["mechanism9"] == ((), True)
        cfg = load_config({str(ROOT / "config" / "ci-mechanism2.yaml")!r}, ['workflow.report="mechanism9"'])
        assert Plan(cfg).trains and round_of(cfg) is paper.ROUNDS["mechanism9"]
        c = paper.claim("mech9.saturation_restores.dgram")
        assert c.rule.min_seeds == 16 and "Holm" in c.rule.text and "20.48" in c.rule.text
        assert "secondary, no Holm" in paper.claim("mech9.solver_restores.hetero-inv").rule.text
        assert paper.claim("mech2.fails.dgram") and paper.claim("mech3.cause.dgram")
        from mwm.experiments import EXPERIMENTS
        assert EXPERIMENTS["mechanism9"].builder().__name__ == "mechanism_round"
        print("ok")
    """)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_an_experiment_is_plain_data_the_schema_can_load_without_the_report():
    out = subprocess.run([sys.executable, "-c", "import sys, mwm.config.names; "
                          "print(sorted(m for m in sys.modules if m.startswith(('mwm.report', 'pandas', 'torch'))))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
    assert all(isinstance(e, Experiment) for e in EXPERIMENTS.values())
