"""Every script of scripts/ answers --help (and -h) with its usage and exit 0, and an unknown argument with
exit 2, before it does anything (rehearse_paper.sh would otherwise start a SLURM cluster as root)."""

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_and_an_unknown_argument(script):
    for flag in ("--help", "-h"):
        res = subprocess.run(["bash", str(script), flag], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0 and script.name in res.stdout, (flag, res.stdout[-1000:], res.stderr[-1000:])
    res = subprocess.run(["bash", str(script), "--no-such-option"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2, res.stdout[-1000:] + res.stderr[-1000:]
