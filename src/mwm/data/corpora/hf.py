"""A Hugging Face dataset that loads without a script, one row one document."""

from __future__ import annotations

from pathlib import Path

from mwm.errors import DataError
from mwm.data.corpora.openwebtext import NANOGPT_OPENWEBTEXT
from mwm.data.corpora.units import HF_UNIT_ROWS, RowsUnit, Source, UNIT_CHARS, split_orders



class HFDataset(Source):
    """A Hugging Face dataset, one row one document (OpenWebText at paper scale)."""

    name = "openwebtext"

    def __init__(self, name: str, split: str = "train", column: str = "text",
                 revision: str | None = None, num_proc: int | None = None):
        try:
            import datasets
        except ImportError as exc:
            raise DataError("corpus openwebtext needs Hugging Face datasets: pip install datasets") from exc
        self.hf_name, self.hf_split, self.column, self.revision = name, split, column, revision
        self.datasets_version = datasets.__version__
        local = Path(name)
        try:
            if local.is_dir() and ((local / "state.json").is_file() or (local / "dataset_dict.json").is_file()):
                ds = datasets.load_from_disk(str(local))
                if isinstance(ds, datasets.DatasetDict):
                    if split not in ds:
                        raise DataError(f"data.hf_split: {split!r} is not a split of {name} (has {sorted(ds)})")
                    ds = ds[split]
            else:
                ds = datasets.load_dataset(name, split=split, revision=revision,
                                           num_proc=num_proc if num_proc and num_proc > 1 else None)
        except DataError:
            raise
        except Exception as exc:  # datasets raises many kinds (FileNotFoundError, ConnectionError, ...)
            hint = ""
            if "scripts are no longer supported" in str(exc):
                hint = (" (this hub revision is a loading script, which datasets>=4 does not run: set "
                        "data.hf_revision to a script-free revision of it, or data.hf_dataset to a local "
                        "copy: a save_to_disk folder or a folder of parquet/json files)")
            raise DataError(f"data.hf_dataset: cannot load {name!r} (split {split!r}): "
                            f"{type(exc).__name__}: {exc}{hint}") from exc
        if column not in ds.column_names:
            raise DataError(f"data.hf_text_field: {name} has no column {column!r} (columns: {ds.column_names})")
        self.ds = ds
        self.n_docs = len(ds)
        if self.n_docs == 0:
            raise DataError(f"the corpus is empty: {name} split {split!r} has no rows")

    def plan(self, method, val_fraction, seed, target=UNIT_CHARS):
        # The document split is split_indices, i.e. what Dataset.train_test_split(test_size=
        # val_fraction, seed=seed, shuffle=True) picks (as nanoGPT calls it); the rows are read
        # by index in the workers, so nothing is written next to the dataset.
        self.worker_state = {"ds": self.ds}
        orders = split_orders(self.n_docs, method, val_fraction, seed)
        return [(name, self._rows(name, order)) for name, order in orders]

    def _rows(self, split, order):
        for start in range(0, len(order), HF_UNIT_ROWS):
            yield RowsUnit(split, "ds", order[start:start + HF_UNIT_ROWS].tolist(), self.column)

    def reference_counts(self) -> dict:
        # whatever its order, a copy of OpenWebText must hold nanoGPT's documents and tokens
        return {**NANOGPT_OPENWEBTEXT, "tolerance": 1e-3, "val_tolerance": 0.1}

    def info(self) -> dict:
        return {"name": self.name, "source": "Hugging Face datasets", "dataset": self.hf_name,
                "revision": self.revision, "hf_split": self.hf_split, "column": self.column,
                "fingerprint": getattr(self.ds, "_fingerprint", None),
                "datasets_version": self.datasets_version, "documents": self.n_docs}
