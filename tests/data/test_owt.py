"""OpenWebText from the loading script's raw archives, offline, on a stand-in built here.

The stand-in has the hub's layout (``subsets/urlsf_subset00..20.tar``, each holding
``openwebtext/urlsf_subsetNN-K_data.xz`` xz tars of ``.txt`` documents) with member
orders that are not sorted, Windows line ends, runs of blank lines, hidden and
non-text members. The references are written independently of the reader: the hub
script's loop on Hugging Face datasets' own ``iter_archive``, and the 2022 script's
extract + ``sorted(os.listdir)`` + ``open(encoding="utf-8")`` on disk; the split is
``Dataset.train_test_split`` as nanoGPT calls it.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from mwm.data import DataError, TokenDataset
from mwm.data.corpora import OWT_ARCHIVES, OWT_REPO, OWT_REVISION
from mwm.data.prepare import prepare
from mwm.data.tokenizer import EOT, get_encoding

QUIET = dict(log=None)
WORDS = ("the of and a to in is you that it he was for on are as with his they I at be this "
         "café — naïve 42 , . ! ? \n \n\n \n\n\n\n \r\n").split(" ")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _inner_xz(rng, n_docs: int, hidden: bool) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        ids = [int(x) for x in rng.permutation(1000)[:n_docs]]  # names not in sorted order
        for j, i in enumerate(ids):
            words = rng.choice(WORDS, size=int(rng.integers(0, 80)))
            text = "  " * (j % 2) + " ".join(words) + "\n\n\n" * (j % 3 == 0)
            _add(tar, f"{i:07d}-{i * 7919 % 100003:x}.txt", text.encode("utf-8"))
        _add(tar, "notes.md", b"not a document")
        if hidden:
            _add(tar, "._0000000-meta.txt", b"hidden, skipped by iter_archive")
    return buf.getvalue()


def make_standin(root: Path, seed: int = 0, n_archives: int = len(OWT_ARCHIVES)) -> Path:
    """A small copy of the hub's ``subsets/`` layout under ``root``."""
    rng = np.random.default_rng(seed)
    sub = root / "subsets"
    sub.mkdir(parents=True)
    for k, name in enumerate(OWT_ARCHIVES[:n_archives]):
        with tarfile.open(sub / name, mode="w") as tar:
            info = tarfile.TarInfo("openwebtext")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            for part in (10, 2, 1):  # archive order 10, 2, 1; sorted by name: 1, 10, 2
                _add(tar, f"openwebtext/urlsf_subset{k:02d}-{part}_data.xz",
                     _inner_xz(rng, int(rng.integers(1, 5)), hidden=(k == 3 and part == 2)))
    return root


def _script_texts(root: Path) -> list[str]:
    """The hub loading script's ``_generate_examples``, on datasets' own ``iter_archive``."""
    from datasets import DownloadManager

    dl = DownloadManager()
    texts = []
    for name in OWT_ARCHIVES:
        for xz_path, xz_f in dl.iter_archive(str(root / "subsets" / name)):
            if not xz_path.endswith(".xz"):
                continue
            for txt_path, txt_f in dl.iter_archive(xz_f):
                if txt_path.endswith(".txt"):
                    texts.append(re.sub("\n\n\n+", "\n\n", txt_f.read().decode("utf-8")).strip())
    return texts


def _sorted_texts(root: Path, work: Path) -> list[str]:
    """The 2022 datasets-library script: extract, sorted listdir, text-mode open."""
    for name in OWT_ARCHIVES:
        with tarfile.open(root / "subsets" / name) as tar:
            tar.extractall(work, filter="data")
    owt = work / "openwebtext"
    texts = []
    for xz in sorted(os.listdir(owt)):
        if not xz.endswith("xz"):
            continue
        ex = work / "ex" / xz
        with tarfile.open(owt / xz) as tar:
            tar.extractall(ex, filter="data")
        for txt in sorted(os.listdir(ex)):
            if txt.endswith("txt"):
                with open(ex / txt, encoding="utf-8") as fh:
                    texts.append(re.sub("\n\n\n+", "\n\n", fh.read()).strip())
    return texts


def _nanogpt_bins(texts: list[str], val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    import datasets

    parts = datasets.Dataset.from_dict({"text": texts}).train_test_split(
        test_size=val_fraction, seed=2357, shuffle=True)
    enc = get_encoding()

    def bins(docs):
        ids = []
        for d in docs:
            ids.extend(enc.encode_ordinary(d))
            ids.append(EOT)
        return np.array(ids, dtype=np.uint16)

    return bins(parts["train"]["text"]), bins(parts["test"]["text"])


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return make_standin(tmp_path_factory.mktemp("owt"))


def _section(root: Path, **kw) -> dict:
    return {"corpus": "openwebtext", "hf_dataset": str(root), "val_fraction": 0.05, "expect": {}, **kw}


@pytest.mark.parametrize("order", ["script", "sorted"])
def test_archives_match_the_loading_script(standin, tmp_path, order):
    pytest.importorskip("datasets")
    texts = _script_texts(standin) if order == "script" else _sorted_texts(standin, tmp_path / "x")
    assert any("\r" in t for t in texts) == (order == "script")  # the stand-in exercises newlines
    train, val = _nanogpt_bins(texts, 0.05)
    out = prepare(_section(standin, archive_order=order), tmp_path / "out", num_proc=2, **QUIET)
    ds = TokenDataset(out)
    np.testing.assert_array_equal(ds.split("train"), train)
    np.testing.assert_array_equal(ds.split("val"), val)
    corpus = ds.meta["corpus"]
    assert corpus["documents"] == len(texts) and corpus["archive_order"] == order
    assert [a["archive"] for a in corpus["archives"]] == list(OWT_ARCHIVES)
    assert sum(a["documents"] for a in corpus["archives"]) == len(texts)
    assert not list(out.glob(".prepare-*"))  # the text store went with the work folder


def test_the_two_orders_differ_on_the_standin(standin, tmp_path):
    a = TokenDataset(prepare(_section(standin), tmp_path / "a", num_proc=1, **QUIET))
    b = TokenDataset(prepare(_section(standin, archive_order="sorted"), tmp_path / "b", num_proc=1, **QUIET))
    assert not np.array_equal(a.split("val"), b.split("val"))


def test_counts_are_checked_and_a_mismatch_writes_nothing(standin, tmp_path):
    out = prepare(_section(standin), tmp_path / "out", num_proc=1, **QUIET)
    meta = TokenDataset(out).meta
    n, tr, va = meta["corpus"]["documents"], meta["splits"]["train"]["tokens"], meta["splits"]["val"]["tokens"]
    exact = {"documents": n, "train_tokens": tr, "val_tokens": va}
    within = {"documents": n, "train_tokens": tr - 10, "val_tokens": va + 10, "val_tolerance": 11 / va}
    prepare(_section(standin, expect=within), out, num_proc=1, **QUIET)  # same total, val within tolerance
    prepare(_section(standin, expect=exact), out, num_proc=1, **QUIET)  # exact counts pass
    assert TokenDataset(out).meta["expected"]["got"] == exact
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(DataError, match=rf"has {n} documents, expected exactly {n + 1}"):
        prepare(_section(standin, expect={**exact, "documents": n + 1}), out, num_proc=1, **QUIET)
    with pytest.raises(DataError, match="val tokens"):
        prepare(_section(standin, expect={**exact, "val_tokens": va + 10}), out, num_proc=1, **QUIET)
    with pytest.raises(DataError, match="train \\+ val tokens"):
        prepare(_section(standin, expect={**exact, "train_tokens": tr - 50, "tolerance": 0.1 * 50 / tr}), out,
                num_proc=1, **QUIET)
    # the default: nanoGPT's published counts, which a small (partial) copy cannot pass
    with pytest.raises(DataError, match="expected exactly 8,013,769"):
        prepare(_section(standin, expect=None), out, num_proc=1, **QUIET)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_missing_or_damaged_archives_are_named(tmp_path):
    root = make_standin(tmp_path / "part", n_archives=19)
    with pytest.raises(DataError, match="lacks 2 of the 21 archives.*urlsf_subset19.tar"):
        prepare(_section(root), tmp_path / "o", **QUIET)
    assert not (tmp_path / "o").exists()
    full = make_standin(tmp_path / "full")
    path = full / "subsets" / OWT_ARCHIVES[4]
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    raw = path.read_bytes()
    for cut in (members[2].offset_data + 100, members[3].offset):  # inside a member; between two
        path.write_bytes(raw[:cut])
        with pytest.raises(DataError, match="urlsf_subset04.tar is damaged or incomplete"):
            prepare(_section(full), tmp_path / "o", num_proc=2, **QUIET)
        assert not (tmp_path / "o").exists()


def test_hub_download_is_pinned_and_complete(standin, tmp_path, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    calls = []

    def fake_download(repo_id, filename, repo_type=None, revision=None, **kw):
        calls.append((repo_id, filename, repo_type, revision))
        dest = tmp_path / "cache" / filename
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(standin / filename, dest)
        return str(dest)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    out = prepare({"corpus": "openwebtext", "val_fraction": 0.05, "expect": {}}, tmp_path / "out",
                  num_proc=1, **QUIET)
    assert calls == [(OWT_REPO, f"subsets/{n}", "dataset", OWT_REVISION) for n in OWT_ARCHIVES]
    local = TokenDataset(prepare(_section(standin), tmp_path / "local", num_proc=1, **QUIET))
    np.testing.assert_array_equal(TokenDataset(out).split("train"), local.split("train"))
    assert TokenDataset(out).meta["corpus"]["revision"] == OWT_REVISION


def test_paper_config_reads_the_pinned_archives():
    from mwm.config import load_config
    from mwm.data.corpora import NANOGPT_OPENWEBTEXT, OpenWebTextArchives, make_source
    from mwm.data.spec import normalize

    src = make_source(normalize(load_config(Path(__file__).parents[2] / "config" / "paper.yaml")["data"]))
    assert isinstance(src, OpenWebTextArchives) and src.location == OWT_REPO and src.revision == OWT_REVISION
    ref = src.reference_counts()
    assert {k: ref[k] for k in NANOGPT_OPENWEBTEXT} == NANOGPT_OPENWEBTEXT and ref["tolerance"] == 1e-3
