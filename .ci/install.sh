#!/usr/bin/env bash
# The install step of the README's first command (kept in one place).
set -euo pipefail
python -m pip install -q -e ".[dev]"
