"""mwm.workflow.stages: the stage manifest the rules, the report, mwm.workflow.dvc and the HTML report's
categories read."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mwm.workflow import stages
from mwm.workflow.stages import STAGES, STUDIES, report_category, rule_file_sections, study_files

ROOT = Path(__file__).resolve().parents[2]


def test_every_stage_names_a_rule_file_and_an_entry_point_that_exist():
    for name, st in STAGES.items():
        assert (ROOT / "rules" / f"{st.rule_file}.smk").is_file(), name
        assert (ROOT / "src" / Path(*st.entry.split("."))).with_suffix(".py").is_file() or \
            (ROOT / "src" / Path(*st.entry.split(".")) / "__main__.py").is_file(), name
        assert set(st.report_reads) <= set(st.outputs), name  # the report reads only what the stage writes
    assert set(STUDIES) == {n for n, st in STAGES.items() if st.entry.startswith("mwm.studies.")}


def test_sections_of_a_rule_file_are_its_stages_union_in_order():
    assert rule_file_sections("studies") == ("studies", "train", "model")
    assert rule_file_sections("data") == ("data",) and rule_file_sections("report") == ()
    assert rule_file_sections("train")[:3] == ("train", "model", "grid")
    with pytest.raises(KeyError):
        rule_file_sections("nope")


def test_writers_name_their_files_by_key_and_an_unknown_key_is_an_error():
    from mwm.studies import absorption, alpha, audits, solvers

    for mod, name in ((alpha, "alpha"), (absorption, "absorption"), (audits, "audits"), (solvers, "solvers")):
        assert mod.FILES is STAGES[name]
        text = Path(mod.__file__).read_text()
        spelled = [f for f in STAGES[name].outputs if f'"{f}"' in text]
        assert not spelled, f"{mod.__name__} spells {spelled}: name them by key (mwm.workflow.stages)"
    assert STAGES["absorption"].file("pairs") == "absorption_pairs.csv"
    with pytest.raises(KeyError, match="no output 'nope'"):
        STAGES["alpha"].file("nope")


def test_study_files_and_what_the_report_reads():
    assert study_files(("solvers",)) == ("solvers.csv", "solvers_summary.csv", "solvers_derived.json")
    assert "alpha_final.csv" in study_files(("alpha",)) and "alpha_final.csv" not in study_files(("alpha",), reads=True)


@pytest.mark.parametrize("item, category", [("ledger", "Ledger"), ("table4_results", "Tables"),
                                            ("fig3_absorption", "Studies"), ("fig_alpha_opt", "Studies"),
                                            ("fig_solvers", "Studies"), ("fig5_val_loss", "Training")])
def test_report_categories(item, category):
    assert report_category(item) == category


def test_rule_files_share_names_through_common_smk_only():
    """The order of the Snakefile's includes is not load-bearing: a name a rule file defines at top
    level is used by no other rule file (shared names live in common.smk or the manifest)."""
    files = {p.name: p.read_text() for p in (ROOT / "rules").glob("*.smk") if p.name != "common.smk"}
    for name, text in files.items():
        defined = set(re.findall(r"^([A-Za-z_]\w*)\s*=", text, flags=re.M))
        defined |= set(re.findall(r"^def (\w+)", text, flags=re.M))
        for other, body in files.items():
            if other != name:
                used = {d for d in defined if re.search(rf"\b{d}\b", body)}
                assert not used, f"rules/{other} uses {sorted(used)} defined in rules/{name}"


def test_torch_free():
    proc = subprocess.run([sys.executable, "-c", "import sys, mwm.workflow.stages; print('torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.stdout.strip() == "False", proc.stderr
    assert stages.__all__
