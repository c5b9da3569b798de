"""OpenWebText from the raw archives of the hub's loading script ``Skylion007/openwebtext``, in the
script's document order, decoded once into a text store."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from mwm.data import workers
from mwm.errors import DataError
from mwm.data.corpora.units import HF_UNIT_ROWS, Source, UNIT_CHARS, split_orders


OWT_REPO = "Skylion007/openwebtext"
# The hub commit that gave the loading script its archives (subsets/, "Make the dataset
# streamable (#3)", 2023-03-24); later commits on main change only the card. hf_revision
# null pins this commit for OWT_REPO.
OWT_REVISION = "39d1a6d3f3a4c838b27bbc65bfb14a2f6f727740"
OWT_SUBDIR = "subsets"
OWT_ARCHIVES = tuple(f"urlsf_subset{i:02d}.tar" for i in range(21))
OWT_READER_VERSION = 1    # bump when the reading below changes its output
# nanoGPT's data/openwebtext/readme.md: documents, and tokens of its train/val split
NANOGPT_OPENWEBTEXT = {"documents": 8_013_769, "train_tokens": 9_035_582_198, "val_tokens": 4_434_897}
_MANY_NEWLINES = re.compile("\n\n\n+")


def _member_ok(info) -> bool:
    """What Hugging Face's ``iter_archive`` yields: regular files, not hidden (``.``, ``__``)."""
    return info.isreg() and not os.path.basename(info.name).startswith((".", "__"))


def _owt_text(raw: bytes, order: str, where: str) -> str:
    """One document as the loading script makes it from a ``.txt`` member's bytes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: byte {exc.start} is not UTF-8 (the loading script decodes strictly)") from exc
    if order == "sorted":  # open(path, encoding="utf-8") of the 2022 script: universal newlines
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _MANY_NEWLINES.sub("\n\n", text).strip()


def _owt_documents(path: Path, order: str) -> Iterator[tuple[str, str, str]]:
    """``(xz member, txt member, text)`` of one outer archive's documents, in the order ``order`` reads them.

    ``script``: the hub's loading script (revision :data:`OWT_REVISION`): ``.xz`` members
    in archive order, each an xz tar whose ``.txt`` members are read in archive order,
    as ``datasets``' ``iter_archive`` streams them. ``sorted``: the ``datasets``
    library's script before 2023 (which made nanoGPT's published counts): the ``.xz``
    files sorted by name, each one's ``.txt`` files sorted by name.
    """
    import io
    import tarfile

    if order == "script":
        with open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r|*") as outer:
            for info in outer:
                if not (_member_ok(info) and info.name.endswith(".xz")):
                    continue
                xz = outer.extractfile(info)
                with tarfile.open(fileobj=xz, mode="r|*") as inner:
                    for tinfo in inner:
                        if _member_ok(tinfo) and tinfo.name.endswith(".txt"):
                            raw = inner.extractfile(tinfo).read()
                            yield info.name, tinfo.name, _owt_text(raw, order, f"{path}: {info.name}/{tinfo.name}")
                outer.members = []
        return
    with tarfile.open(path, mode="r:") as outer:
        xzs = sorted((m for m in outer.getmembers() if m.isreg() and m.name.endswith("xz")),
                     key=lambda m: os.path.basename(m.name))
        for info in xzs:
            data = outer.extractfile(info).read()
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as inner:
                txts = sorted((m for m in inner.getmembers() if m.isreg() and m.name.endswith("txt")),
                              key=lambda m: m.name)
                for tinfo in txts:
                    raw = inner.extractfile(tinfo).read()
                    yield info.name, tinfo.name, _owt_text(raw, order, f"{path}: {info.name}/{tinfo.name}")


def _check_tar_complete(path: Path) -> None:
    """An uncompressed tar whose last member's data and the end-of-archive zero blocks are all there
    (tarfile itself ends quietly at a truncation that falls between members)."""
    import tarfile

    size = path.stat().st_size
    with tarfile.open(path, mode="r:") as tar:
        members = tar.getmembers()
    end = 0
    if members:
        last = members[-1]
        end = last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    with open(path, "rb") as fh:
        fh.seek(end)
        tail = fh.read(2 * tarfile.BLOCKSIZE)
    if not members or size < end + 2 * tarfile.BLOCKSIZE or tail.strip(b"\0"):
        raise DataError(f"archive {path} is damaged or incomplete (it does not end after its "
                        f"{len(members)} members as a tar file does, size {size:,} bytes); delete it and "
                        f"download it again")


def _decode_archive(job: tuple) -> dict:
    """Worker: one outer archive -> ``<k>.txt`` (UTF-8 texts back to back) + ``<k>.idx``."""
    k, path, order, folder = job
    path, folder = Path(path), Path(folder)
    offsets, first, last = [0], None, None
    try:
        _check_tar_complete(path)
        with open(folder / f"{k:02d}.txt", "wb") as out:
            for xz, _, text in _owt_documents(path, order):
                data = text.encode("utf-8")
                out.write(data)
                offsets.append(offsets[-1] + len(data))
                xz = os.path.basename(xz)
                first = first or xz
                last = xz
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read archive {path}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # tarfile.TarError, lzma.LZMAError: a damaged or partial download
        if isinstance(exc, DataError):
            raise
        raise DataError(f"archive {path} is damaged or incomplete ({type(exc).__name__}: {exc}); "
                        f"delete it and download it again") from exc
    np.save(folder / f"{k:02d}.idx.npy", np.asarray(offsets, dtype=np.int64))
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return {"archive": path.name, "bytes": path.stat().st_size, "sha256": h.hexdigest(),
            "documents": len(offsets) - 1, "first_xz": first, "last_xz": last}


_STORE: dict = {}


def _store(folder: str, n_archives: int):
    """This process's open view of a text store: (memmaps, offsets, first doc of each archive)."""
    key = (folder, n_archives)
    if key not in _STORE:
        _STORE.clear()
        maps, offs = [], []
        for k in range(n_archives):
            offs.append(np.load(Path(folder) / f"{k:02d}.idx.npy"))
            size = int(offs[-1][-1])
            maps.append(np.memmap(Path(folder) / f"{k:02d}.txt", dtype=np.uint8, mode="r") if size else
                        np.empty(0, dtype=np.uint8))
        starts = np.cumsum([0] + [len(o) - 1 for o in offs])
        _STORE[key] = (maps, offs, starts)
    return _STORE[key]


@dataclass
class StoreUnit:
    """Documents ``docs`` (global indices, in this order) of the text store in ``folder``."""

    split: str
    folder: str
    n_archives: int
    docs: list

    def texts(self) -> Iterator[tuple[str, bool]]:
        maps, offs, starts = _store(self.folder, self.n_archives)
        for i in self.docs:
            k = int(np.searchsorted(starts, i, side="right")) - 1
            j = i - int(starts[k])
            a, b = int(offs[k][j]), int(offs[k][j + 1])
            yield bytes(maps[k][a:b]).decode("utf-8"), True


class OpenWebTextArchives(Source):
    """OpenWebText from the loading script's 21 ``subsets/urlsf_subsetNN.tar`` archives.

    ``location``: a hub dataset repo (downloaded with ``huggingface_hub`` into its cache
    at ``revision``; null pins :data:`OWT_REVISION` for :data:`OWT_REPO`), or a local
    folder holding the archives (in ``subsets/`` or at its top), for offline use.
    :meth:`materialize` decodes them, ``num_proc`` archives at a time, into a text store
    in the work folder (about 40 GB for the full corpus), in the order ``order`` reads
    them; the documents are then read from it by index.
    """

    name = "openwebtext"

    def __init__(self, location: str, revision: str | None = None, order: str = "script",
                 archives: Sequence[str] = OWT_ARCHIVES):
        if order not in ("script", "sorted"):
            raise DataError(f"data.archive_order: {order!r} is not one of ['script', 'sorted']")
        self.location, self.order, self.archive_names = location, order, tuple(archives)
        self.local = Path(location).is_dir()
        if self.local:
            self.revision = None
        elif revision is None and location == OWT_REPO:
            self.revision = OWT_REVISION
        else:
            self.revision = revision
        self.paths: list[Path] | None = None
        self.folder: Path | None = None
        self.archives: list[dict] = []
        if self.local:
            self.paths = self._local_paths()

    def _local_paths(self) -> list[Path]:
        root = Path(self.location)
        base = root / OWT_SUBDIR if (root / OWT_SUBDIR).is_dir() else root
        missing = [n for n in self.archive_names if not (base / n).is_file()]
        if missing:
            raise DataError(f"data.hf_dataset: the local folder {root} lacks {len(missing)} of the "
                            f"{len(self.archive_names)} archives of {OWT_REPO} ({', '.join(missing[:4])}"
                            f"{', ...' if len(missing) > 4 else ''}) in {base}; a partial corpus is not the "
                            f"paper's. Get them with: huggingface-cli download {OWT_REPO} --repo-type dataset "
                            f"--revision {OWT_REVISION} --include '{OWT_SUBDIR}/*' --local-dir {root}")
        return [base / n for n in self.archive_names]

    def _download(self, log) -> list[Path]:
        try:
            from huggingface_hub import hf_hub_download
        except ImportError as exc:
            raise DataError("corpus openwebtext downloads its archives with huggingface_hub: "
                            "pip install huggingface_hub (or set data.hf_dataset to a local folder)") from exc
        paths = []
        for n, name in enumerate(self.archive_names):
            log(f"  archive {n + 1}/{len(self.archive_names)}: {self.location}@{self.revision or 'main'} "
                f"{OWT_SUBDIR}/{name}")
            try:
                paths.append(Path(hf_hub_download(self.location, f"{OWT_SUBDIR}/{name}", repo_type="dataset",
                                                  revision=self.revision)))
            except Exception as exc:  # network, auth, missing file: all end the run here, named
                raise DataError(f"data.hf_dataset: cannot download {OWT_SUBDIR}/{name} of {self.location} "
                                f"(revision {self.revision or 'main'}): {type(exc).__name__}: {exc}. Offline, "
                                f"set data.hf_dataset to a folder holding the archives") from exc
        return paths

    def materialize(self, workdir: Path, num_proc: int, log) -> None:
        """Download (if needed) and decode the archives into ``workdir/openwebtext-text``."""
        paths = self.paths if self.paths is not None else self._download(log)
        folder = Path(workdir) / "openwebtext-text"
        folder.mkdir(parents=True, exist_ok=True)
        jobs = [(k, str(p), self.order, str(folder)) for k, p in enumerate(paths)]
        log(f"  decoding {len(jobs)} archives ({self.order} order) into {folder}")
        self.archives = list(workers.map_ordered(_decode_archive, jobs, num_proc))
        if self.order == "sorted":  # the 2022 script sorted all .xz names at once: archives must not interleave
            for a, b in zip(self.archives, self.archives[1:]):
                if a["last_xz"] and b["first_xz"] and a["last_xz"] > b["first_xz"]:
                    raise DataError(f"archive_order sorted: {b['archive']} starts with {b['first_xz']}, before "
                                    f"{a['archive']}'s last {a['last_xz']}; these archives cannot be read in "
                                    f"one sorted pass")
        self.folder = folder
        self.n_docs = sum(a["documents"] for a in self.archives)
        if self.n_docs == 0:
            raise DataError(f"the corpus is empty: the archives of {self.location} hold no .txt documents")

    def plan(self, method, val_fraction, seed, target=UNIT_CHARS):
        if self.folder is None:
            raise DataError("OpenWebTextArchives.plan before materialize")
        orders = split_orders(self.n_docs, method, val_fraction, seed)
        return [(name, self._units(name, order)) for name, order in orders]

    def _units(self, split, order):
        for start in range(0, len(order), HF_UNIT_ROWS):
            yield StoreUnit(split, str(self.folder), len(self.archives),
                            order[start:start + HF_UNIT_ROWS].tolist())

    def close(self) -> None:
        _STORE.clear()

    def reference_counts(self) -> dict:
        # nanoGPT's figures come from the 2022 script (sorted order); the hub script may
        # put other documents into val, so its val tokens are held to 10% only.
        return {**NANOGPT_OPENWEBTEXT, "tolerance": 1e-3,
                "val_tolerance": 1e-3 if self.order == "sorted" else 0.1}

    def info(self) -> dict:
        return {"name": self.name, "source": f"the raw archives of the {OWT_REPO} loading script, read in "
                f"its document order without running it (mwm reader v{OWT_READER_VERSION})",
                "location": self.location, "revision": self.revision, "archive_order": self.order,
                "reader_version": OWT_READER_VERSION, "documents": self.n_docs,
                "archives": [{k: a[k] for k in ("archive", "bytes", "sha256", "documents")}
                             for a in self.archives]}
