"""The data stage end to end: prepare, the reader, the vocab remap, bad input, CLI, config."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mwm.config import ConfigError, load_config
import mwm.data.prepare as prepare_mod
from mwm.data import DataError, TokenDataset, dataset_dir
from mwm.data.prepare import prepare
from mwm.data.__main__ import main
from mwm.data.corpora import split_indices
from mwm.data.tokenizer import EOT, get_encoding
from mwm.data.vocab import check_fits_uint16
import errno
import os
import time
import fakedata

QUIET = dict(log=None)


def _write_corpus(folder: Path, n: int = 12) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = ["the", "king", "queen", "of", "Denmark", "is", "dead", "long", "live", "O", "Romeo", "thou",
             "art", "42", "café", "—", "wherefore", ",", ".", "!", "\n", "\n\n"]
    paths = []
    for i in range(n):
        text = " ".join(rng.choice(words, size=int(rng.integers(20, 400))))
        p = folder / f"doc{i:02d}.txt"
        p.write_text(f"Document {i}\n{text}\n", encoding="utf-8")
        paths.append(p)
    return paths


def _reference(docs: list[str]) -> np.ndarray:
    """nanoGPT's loop: encode_ordinary each document, append EOT, concatenate."""
    enc = get_encoding()
    ids = []
    for d in docs:
        ids.extend(enc.encode_ordinary(d))
        ids.append(EOT)
    return np.array(ids, dtype=np.uint16)


def _snapshot(folder: Path) -> dict:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def shk(tmp_path_factory):
    return prepare({"corpus": "shakespeare"}, tmp_path_factory.mktemp("shk") / "out", num_proc=2, **QUIET)


@pytest.fixture()
def corpus(tmp_path):
    return _write_corpus(tmp_path / "corpus")


def _text_section(paths, **kw):
    return {"corpus": "text", "paths": [str(p) for p in paths], "val_fraction": 0.2, **kw}


# -- the Shakespeare corpus, golden -------------------------------------------


def test_shakespeare_golden(shk):
    ds = TokenDataset(shk)
    m = ds.meta
    assert ds.vocab_size == 50257 and ds.eot == EOT and m["remap"] is None
    assert m["splits"]["train"]["tokens"] == 1489168 and m["splits"]["val"]["tokens"] == 42389
    assert m["splits"]["train"]["sha256"] == "576653dfb09553f90584f7a23949f2eb36b9f42102ea30ed216d45ec6815b218"
    assert m["splits"]["val"]["sha256"] == "cdc52198ef264ce041f8624ca60a4dfd53967c2f57527198764da79d7a4e75d1"
    assert m["split"] == {"method": "documents", "val_fraction": 0.0005, "seed": 2357}
    assert m["corpus"]["name"] == "shakespeare" and m["corpus"]["version"] == "3.0.0"
    assert m["tokenizer"]["bpe_sha256"]["vocab.bpe"].startswith("1ce1664773c5")
    train, val = ds.split("train"), ds.split("val")
    assert isinstance(train, np.memmap) and train.dtype == np.uint16
    assert int((train == EOT).sum()) == m["splits"]["train"]["documents"] == 37
    assert int((val == EOT).sum()) == 1 and val[-1] == EOT
    assert get_encoding().decode(val[:20].tolist()).startswith("A Winter's Tale\n\nACT I\n\nSCENE I.")
    ds.verify_checksums()
    assert sorted(p.name for p in shk.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_shakespeare_small_vocab(tmp_path, shk):
    out = prepare({"corpus": "shakespeare", "vocab_size": 2048}, tmp_path / "v", num_proc=2, **QUIET)
    ds, full = TokenDataset(out), TokenDataset(shk)
    remap = ds.meta["remap"]
    assert ds.vocab_size == 2049 and remap["k"] == 2048 and remap["unk_id"] == 2048
    kept = np.array(remap["kept_ids"])
    assert len(kept) == 2048 and EOT in kept and np.all(np.diff(kept) > 0)
    counts = np.bincount(full.split("train"), minlength=50257)
    order = np.lexsort((np.arange(50257), -counts))
    assert set(kept.tolist()) == set(order[:2047].tolist()) | {EOT}  # EOT (37 uses) forced in
    table = np.full(50257, 2048, dtype=np.uint16)
    table[kept] = np.arange(2048)
    for split in ("train", "val"):
        np.testing.assert_array_equal(ds.split(split), table[full.split(split)])
        unk = int((ds.split(split) == 2048).sum())
        assert remap["unk_tokens"][split] == unk
        assert remap["unk_share"][split] == pytest.approx(unk / len(ds.split(split)), abs=1e-8)
    assert 0.05 < remap["unk_share"]["train"] < 0.2 and 0.05 < remap["unk_share"]["val"] < 0.2
    assert ds.eot == int(table[EOT]) and int((ds.split("train") == ds.eot).sum()) == 37


# -- text corpus: order, workers, splits ----------------------------------------


def test_text_matches_nanogpt_loop_and_workers(tmp_path, corpus):
    sec = _text_section(corpus)
    a = prepare(sec, tmp_path / "a", num_proc=1, unit_chars=300, **QUIET)
    b = prepare(sec, tmp_path / "b", num_proc=2, unit_chars=300, **QUIET)
    for name in ("train.bin", "val.bin", "meta.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    docs = [p.read_text(encoding="utf-8") for p in corpus]
    train_idx, val_idx = split_indices(len(docs), 0.2, 2357)
    ds = TokenDataset(a)
    np.testing.assert_array_equal(ds.split("train"), _reference([docs[i] for i in train_idx]))
    np.testing.assert_array_equal(ds.split("val"), _reference([docs[i] for i in val_idx]))
    files = ds.meta["corpus"]["files"]
    assert [f["path"] for f in files] == [str(p) for p in corpus] and all(len(f["sha256"]) == 64 for f in files)


def test_tail_split(tmp_path, corpus):
    out = prepare(_text_section(corpus, split="tail", val_fraction=0.1), tmp_path / "t", num_proc=2,
                  unit_chars=500, **QUIET)
    ds = TokenDataset(out)
    ref = _reference([p.read_text(encoding="utf-8") for p in corpus])
    n_val = math.ceil(0.1 * len(ref))
    np.testing.assert_array_equal(ds.split("val"), ref[-n_val:])
    np.testing.assert_array_equal(ds.split("train"), ref[:-n_val])
    assert ds.meta["splits"]["train"]["documents"] + ds.meta["splits"]["val"]["documents"] == len(corpus)


def test_small_vocab_ties_and_determinism(tmp_path, corpus):
    sec = _text_section(corpus, vocab_size=10)
    a = prepare(sec, tmp_path / "a", num_proc=2, unit_chars=400, **QUIET)
    b = prepare(sec, tmp_path / "b", num_proc=1, **QUIET)
    assert (a / "meta.json").read_bytes() == (b / "meta.json").read_bytes()
    full = TokenDataset(prepare(_text_section(corpus), tmp_path / "f", num_proc=1, **QUIET))
    ds = TokenDataset(a)
    counts = np.bincount(full.split("train"), minlength=50257)
    kept = ds.meta["remap"]["kept_ids"]
    top = sorted(range(50257), key=lambda i: (-counts[i], i))[:10]
    assert kept == sorted(top if EOT in top else top[:9] + [EOT])
    assert ds.vocab_size == 11 and int(ds.split("train").max()) <= 10 and int(ds.split("val").max()) <= 10


# -- openwebtext: the Hugging Face path, offline on a dataset built here --------------------


def test_openwebtext_path_offline(tmp_path):
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(1)
    words = "the of and a to in is you that it he was for on are as with his they I at be this".split()
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 200)))) for _ in range(300)]
    texts[5] = ""
    datasets.Dataset.from_dict({"text": texts, "id": list(range(300))}).save_to_disk(str(tmp_path / "ds"))
    sec = {"corpus": "openwebtext", "hf_layout": "datasets", "hf_dataset": str(tmp_path / "ds"),
           "val_fraction": 0.02, "expect": {}}
    out = prepare(sec, tmp_path / "out", num_proc=2, **QUIET)
    ds = TokenDataset(out)
    # what nanoGPT's openwebtext/prepare.py computes
    parts = datasets.load_from_disk(str(tmp_path / "ds")).train_test_split(
        test_size=0.02, seed=2357, shuffle=True)
    np.testing.assert_array_equal(ds.split("train"), _reference(parts["train"]["text"]))
    np.testing.assert_array_equal(ds.split("val"), _reference(parts["test"]["text"]))
    assert ds.meta["splits"]["val"]["documents"] == 6
    assert ds.meta["corpus"]["dataset"] == str(tmp_path / "ds") and ds.meta["corpus"]["documents"] == 300
    with pytest.raises(DataError, match="no column 'body'"):
        prepare({**sec, "hf_text_field": "body"}, tmp_path / "o2", **QUIET)


# -- bad input: clear errors, outputs untouched ---------------------------------


def test_bad_utf8_leaves_outputs_untouched(tmp_path, corpus):
    out = prepare(_text_section(corpus), tmp_path / "out", num_proc=1, **QUIET)
    before = _snapshot(out)
    corpus[3].write_bytes(corpus[3].read_bytes()[:20] + b"\xc3\x28" + b" more\n")
    with pytest.raises(DataError, match=rf"{corpus[3].name}: byte offset 20 is not UTF-8"):
        prepare(_text_section(corpus), out, num_proc=2, **QUIET)
    assert _snapshot(out) == before and not list(out.glob(".prepare-*"))
    with pytest.raises(DataError):
        prepare(_text_section(corpus), tmp_path / "new", num_proc=1, **QUIET)
    assert not (tmp_path / "new").exists()
    out2 = prepare(_text_section(corpus, encoding_errors="replace"), tmp_path / "rep", num_proc=1, **QUIET)
    assert TokenDataset(out2).meta["corpus"]["files"][3]["invalid_bytes"] == 1


def test_refuses_other_tokenizer_bins(tmp_path, corpus):
    out = prepare(_text_section(corpus), tmp_path / "out", num_proc=1, **QUIET)
    before = _snapshot(out)
    with pytest.raises(DataError, match=r"holds bins made with tokenizer gpt2 with the full vocabulary.*--force"):
        prepare(_text_section(corpus, vocab_size=50), out, num_proc=1, **QUIET)
    meta = json.loads((out / "meta.json").read_text())
    meta["tokenizer"]["bpe_sha256"]["vocab.bpe"] = "0" * 64
    (out / "meta.json").write_text(json.dumps(meta))
    before = _snapshot(out)
    with pytest.raises(DataError, match="holds bins made with"):
        prepare(_text_section(corpus), out, num_proc=1, **QUIET)
    assert _snapshot(out) == before
    prepare(_text_section(corpus), out, num_proc=1, force=True, **QUIET)
    TokenDataset(out).verify_checksums()
    (out / "meta.json").unlink()
    with pytest.raises(DataError, match="without a meta.json"):
        prepare(_text_section(corpus), out, num_proc=1, **QUIET)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="not a folder"):
        prepare(_text_section(corpus), tmp_path / "file", **QUIET)


def test_vocab_must_fit_uint16(tmp_path, corpus, monkeypatch):
    check_fits_uint16(65536, "ok")
    with pytest.raises(DataError, match="65537 ids does not fit the uint16"):
        check_fits_uint16(65537, "x")
    real = prepare_mod.tokenizer_info()
    monkeypatch.setattr(prepare_mod, "tokenizer_info", lambda: {**real, "name": "cl100k_base", "n_vocab": 100277})
    with pytest.raises(DataError, match="tokenizer cl100k_base: a vocabulary of 100277 ids does not fit"):
        prepare(_text_section(corpus), tmp_path / "o", **QUIET)
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="vocab_size"):
        prepare(_text_section(corpus, vocab_size=70000), tmp_path / "o", **QUIET)


def test_empty_and_missing_corpora(tmp_path):
    (tmp_path / "e.txt").write_bytes(b"")
    with pytest.raises(DataError, match="corpus is empty"):
        prepare(_text_section([tmp_path / "e.txt", tmp_path / "e.txt"]), tmp_path / "o", **QUIET)
    with pytest.raises(DataError, match="does not exist"):
        prepare(_text_section([tmp_path / "nope.txt"]), tmp_path / "o", **QUIET)
    (tmp_path / "one.txt").write_text("just one document")
    with pytest.raises(DataError, match="at least 2 documents"):
        prepare(_text_section([tmp_path / "one.txt"]), tmp_path / "o", **QUIET)
    with pytest.raises(DataError, match="needs data.paths"):
        prepare({"corpus": "text"}, tmp_path / "o", **QUIET)
    assert not (tmp_path / "o").exists()


# -- the reader ------------------------------------------------------------------


def test_reader_refuses_damaged_files(tmp_path, corpus):
    out = prepare(_text_section(corpus), tmp_path / "out", num_proc=1, **QUIET)
    ds = TokenDataset(out)
    n = ds.meta["splits"]["train"]["bytes"]
    with pytest.raises(DataError, match="split 'test'"):
        ds.split("test")
    data = (out / "train.bin").read_bytes()
    (out / "train.bin").write_bytes(data[:-2])
    with pytest.raises(DataError, match=rf"train\.bin: {n - 2} bytes on disk, meta.json says {n}"):
        TokenDataset(out)
    (out / "train.bin").write_bytes(data[:10] + bytes([data[10] ^ 1]) + data[11:])
    ds = TokenDataset(out)  # same size: opens, but the checksum finds it
    with pytest.raises(DataError, match=r"train\.bin: sha256 .* differs from meta.json"):
        ds.verify_checksums()
    (out / "val.bin").unlink()
    with pytest.raises(DataError, match=r"val\.bin does not exist"):
        TokenDataset(out)
    (out / "meta.json").unlink()
    with pytest.raises(DataError, match=r"meta\.json does not exist"):
        TokenDataset(out)
    assert issubclass(DataError, ValueError)


# -- config, folder names, command line ---------------------------------------------


def test_dataset_dir():
    assert dataset_dir({"corpus": "shakespeare", "vocab_size": 2048}) == Path("data/shakespeare-v2048")
    assert dataset_dir({}) == Path("data/shakespeare")
    assert dataset_dir({"corpus": "openwebtext", "num_proc": 16}) == Path("data/openwebtext")
    assert dataset_dir({"vocab_size": 256, "split": "tail", "val_fraction": 0.1, "seed": 5}) == \
        Path("data/shakespeare-v256-tail0.1")  # a tail split does not shuffle: no seed
    assert dataset_dir({"seed": 1, "val_fraction": 0.01}) == Path("data/shakespeare-val0.01-seed1")
    t1 = dataset_dir({"corpus": "text", "paths": ["a.txt"]})
    assert t1.name.startswith("text-") and len(t1.name) == 17
    assert t1 != dataset_dir({"corpus": "text", "paths": ["b.txt"]})
    assert t1 != dataset_dir({"corpus": "text", "paths": ["a.txt"], "encoding_errors": "replace"})
    assert dataset_dir({"corpus": "text", "paths": ["a.txt"], "num_proc": 1}) == t1
    assert dataset_dir({"corpus": "openwebtext", "hf_dataset": "/local/owt"}).name.startswith("openwebtext-")
    assert dataset_dir({"vocab_size": 512}, root="/x") == Path("/x/shakespeare-v512")


def test_config_data_section(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  vocab_size: 2048\n")
    data = load_config(cfg)["data"]
    assert data["corpus"] == "shakespeare" and data["vocab_size"] == 2048 and data["val_fraction"] == 0.0005
    assert data["seed"] == 2357 and data["encoding_errors"] == "strict" and data["num_proc"] is None
    cfg.write_text("data:\n  vocab: 2048\n")
    with pytest.raises(ConfigError, match="vocab"):
        load_config(cfg)
    cfg.write_text("data:\n  corpus: wikipedia\n")
    with pytest.raises(ConfigError, match="data.corpus"):
        load_config(cfg)


def test_cli(tmp_path, corpus, capsys):
    out = tmp_path / "cli"
    cfg = tmp_path / "c.yaml"
    # (model.block_size: prepare --config checks the splits against the config's model)
    cfg.write_text(f"data:\n  corpus: text\n  paths: ['{corpus[0].parent}/*.txt']\n  val_fraction: 0.2\n"
                   "model:\n  block_size: 64\n")
    assert main(["prepare", "--config", str(cfg), "--vocab-size", "30", "--num-proc", "1",
                 "--out", str(out), "--verify"]) == 0
    assert TokenDataset(out).vocab_size == 31 and capsys.readouterr().out.strip() == str(out)
    assert main(["info", str(out), "--verify"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["vocab_size"] == 31 and info["checksums"] == "verified"
    assert main(["prepare", "--corpus", "text", "--paths", str(corpus[0].parent / "*.txt"),
                 "--out", str(out)]) == 1  # other vocabulary in out
    assert "--force" in capsys.readouterr().err
    assert main(["dir", "--corpus", "shakespeare", "--set", "vocab_size=2048"]) == 0
    assert capsys.readouterr().out.strip() == "data/shakespeare-v2048"
    assert main(["provision-tokenizer", "--check"]) == 0
    res = subprocess.run([sys.executable, "-m", "mwm.data", "prepare", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--corpus" in res.stdout and "--config" in res.stdout


def test_prepare_removes_work_folders_of_killed_prepares(tmp_path, corpus):
    """A killed prepare leaves its .prepare-* folder (OpenWebText: ~40 GB); the next one
    removes those of dead processes of this host and keeps the others."""
    import os
    import socket

    from mwm.lock import proc_start

    host, me = socket.gethostname(), os.getpid()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    out = tmp_path / "t"
    names = {
        "dead": f".prepare-{host}-{dead_pid}-12345-abc_1",
        "reused": f".prepare-{host}-{me}-1-xyz",  # our pid, another start time: its process is gone
        "live": f".prepare-{host}-{me}-{proc_start(me) or 0}-live",
        "other_host": ".prepare-elsewhere-1-1-q",
        "legacy": ".prepare-k3j2h1",
    }
    for name in names.values():
        (out / name).mkdir(parents=True)
        (out / name / "all.raw").write_bytes(b"x" * 1000)
    logs = []
    prepare(_text_section(corpus), out, num_proc=1, log=logs.append)
    left = sorted(p.name for p in out.iterdir() if p.name.startswith(".prepare-"))
    assert left == sorted([names["live"], names["other_host"], names["legacy"]])
    assert (out / "train.bin").is_file() and (out / "meta.json").is_file()
    text = "\n".join(logs)
    assert f"removed {out / names['dead']}" in text and f"removed {out / names['reused']}" in text
    assert "host elsewhere" in text and "older prepare" in text


# -- training verifies the bins; a full disk in prepare ----------

TEXT_DATA = {"corpus": "text", "paths": ["corpus/*.txt"], "vocab_size": 64, "num_proc": 1}


@pytest.fixture()
def prepared(tmp_path, monkeypatch):
    """A small prepared folder under tmp_path/data (the cwd), and a config that trains on it."""
    from mwm.data import dataset_dir, prepare_dataset

    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    rng = np.random.default_rng(0)
    words = ["the", "king", "of", "Denmark", "is", "dead", "long", "live", "O", "thou", ",", ".", "\n"]
    for i in range(6):
        (tmp_path / "corpus" / f"d{i}.txt").write_text(" ".join(rng.choice(words, size=600)))
    folder = prepare_dataset(TEXT_DATA, log=None)
    assert folder == dataset_dir(TEXT_DATA)
    cfg = fakedata.write_config(tmp_path / "tiny.yaml", train__max_iters=2, train__eval_interval=2,
                                train__lr_decay_iters=2, data__corpus="text", data__paths=TEXT_DATA["paths"],
                                data__vocab_size=64, data__num_proc=1)
    return tmp_path / folder, cfg


def _train(cfg, out) -> subprocess.CompletedProcess:
    """Trains in a child process, as the workflow's train job does (its exit code and stderr are checked)."""
    return subprocess.run([sys.executable, "-m", "mwm.train", "--config", str(cfg), "--assignment", "none",
                           "--seed", "0", "--out", str(out)], capture_output=True, text=True, timeout=300)


def _rewrite_meta(folder, edit):
    meta = json.loads((folder / "meta.json").read_text())
    edit(meta)
    if "meta_sha256" in meta:
        from mwm.data.reader import meta_digest

        meta["meta_sha256"] = meta_digest(meta)
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


@pytest.mark.slow
def test_training_refuses_a_flipped_byte_in_val_bin(prepared):
    folder, cfg = prepared
    assert _train(cfg, "ok").returncode == 0
    raw = bytearray((folder / "val.bin").read_bytes())
    raw[10] ^= 1  # same size: the open-time size check cannot see it
    (folder / "val.bin").write_bytes(bytes(raw))
    bad = _train(cfg, "bad")
    err = bad.stderr
    assert bad.returncode == 2, err
    assert "val.bin" in err and "sha256" in err, err
    assert not Path("bad/runs").exists() or not list(Path("bad").rglob("summary.json"))


def test_verdict_is_cached_by_size_and_mtime(prepared, monkeypatch):
    from mwm.data import TokenDataset

    folder, _ = prepared
    assert TokenDataset(folder).verify_cached() is True  # first time: read in full
    calls = []
    real = TokenDataset._scan
    monkeypatch.setattr(TokenDataset, "_scan", lambda self, split: calls.append(split) or real(self, split))
    assert TokenDataset(folder).verify_cached() is False and calls == []
    os.utime(folder / "train.bin", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert TokenDataset(folder).verify_cached() is True and calls == ["train", "val"]


def test_a_bin_altered_with_its_mtime_put_back_is_hashed_again(prepared):
    from mwm.data import DataError, TokenDataset

    folder, _ = prepared
    assert TokenDataset(folder).verify_cached() is True
    path = folder / "train.bin"
    st = path.stat()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 1  # same size, its mtime restored below: only the change time moves
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(DataError, match="train.bin: "):  # its hash, or an id outside the vocabulary
        TokenDataset(folder).verify_cached()


@pytest.mark.slow
def test_edited_vocab_size_in_meta_is_refused(prepared, capsys):
    from mwm.data.__main__ import main as data_main

    folder, cfg = prepared
    meta = json.loads((folder / "meta.json").read_text())
    meta["vocab_size"] = 50257  # a hand edit: the file no longer matches its own hash
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    assert data_main(["info", str(folder), "--verify"]) == 1
    err = capsys.readouterr().err
    assert "meta.json" in err and ("vocab_size" in err or "edited" in err), err
    # the same edit with the self-hash recomputed: the cross-check against the remap refuses it
    _rewrite_meta(folder, lambda m: m.update(vocab_size=50257))
    assert data_main(["info", str(folder), "--verify"]) == 1
    err = capsys.readouterr().err
    assert "meta.json" in err and "vocab_size" in err, err
    assert _train(cfg, "x").returncode == 2


@pytest.mark.slow
def test_token_id_outside_the_vocabulary_names_file_and_offset(prepared):
    from mwm.data.reader import sha256_file

    folder, cfg = prepared
    ids = np.fromfile(folder / "train.bin", dtype="<u2")
    ids[123] = 1000  # vocab is 65
    ids.tofile(folder / "train.bin")
    _rewrite_meta(folder, lambda m: m["splits"]["train"].update(sha256=sha256_file(folder / "train.bin")))
    run = _train(cfg, "x")
    err = run.stderr
    assert run.returncode == 2 and "train.bin" in err and "offset 123" in err and "1000" in err, err


def test_full_disk_in_prepare_is_one_clear_line(tmp_path, monkeypatch, capsys):
    from mwm.data.__main__ import main as data_main

    corpus = tmp_path / "c.txt"
    corpus.write_text("the king is dead, long live the king\n" * 50)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "out" / ".prepare-x" / "train.raw"))
        yield  # a generator, like encode_units

    monkeypatch.setattr("mwm.data.prepare.encode_units", full)
    rc = data_main(["prepare", "--corpus", "text", "--paths", str(corpus), "--split", "tail", "--out",
                    str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("mwm.data: ")]
    assert rc == 1 and len(lines) == 1, err
    assert "no space left on device" in lines[0] and "train.raw" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_preparing_again_leaves_identical_files_untouched(tmp_path, corpus):
    import os

    out = prepare(_text_section(corpus), tmp_path / "out", num_proc=1, **QUIET)
    names = ("train.bin", "val.bin", "meta.json")
    for name in names:  # an old mtime, so a rewrite cannot hide inside the clock's resolution
        os.utime(out / name, ns=(1_000_000_000, 1_000_000_000))
    before = {n: ((out / n).stat().st_mtime_ns, (out / n).stat().st_ino, (out / n).read_bytes()) for n in names}
    prepare(_text_section(corpus), out, num_proc=2, **QUIET)
    assert {n: ((out / n).stat().st_mtime_ns, (out / n).stat().st_ino, (out / n).read_bytes()) for n in names} == before
    # a damaged split is rewritten, the others stay
    (out / "val.bin").write_bytes(b"\0\0")
    os.utime(out / "val.bin", ns=(1_000_000_000, 1_000_000_000))
    prepare(_text_section(corpus), out, num_proc=1, force=True, **QUIET)
    assert (out / "val.bin").read_bytes() == before["val.bin"][2]
    assert (out / "train.bin").stat().st_mtime_ns == before["train.bin"][0]


def test_prepare_without_a_config_or_a_corpus_says_what_to_give(tmp_path, capsys, monkeypatch):
    from mwm.data.__main__ import main

    monkeypatch.chdir(tmp_path)
    assert main(["prepare"]) == 2
    assert "give --config FILE" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()
