"""Vocabularies: raw categorical values -> ids and back, per field and per model, on disk.

- :mod:`~ssl_rec.vocab.strings`: string arrays as bytes (buffers, exact keys, stable hashes);
- :mod:`~ssl_rec.vocab.coded_column`: a column as distinct values + codes, value counts;
- :mod:`~ssl_rec.vocab.field_vocabulary`: :class:`Vocabulary`, one field's values and ids;
- :mod:`~ssl_rec.vocab.model_vocabularies`: :class:`Vocabularies`, every field of a model,
  as checkpoint tensors or one Arrow file;
- :mod:`~ssl_rec.vocab.on_disk`: ``vocabulary.arrow`` in an artifact directory, found again
  (and the per-field files of artifacts written before it, read for compatibility);
- :mod:`~ssl_rec.vocab.dense_statistics`: :class:`DenseStatistics`, the dense columns'
  training mean, std and quantile edges (fitted and carried like the vocabularies).
"""

from ssl_rec.vocab.coded_column import CodedColumn, count_values, merge_counts
from ssl_rec.vocab.dense_statistics import (
    DENSE_QUANTILE_BINS,
    DENSE_STATISTICS_KEY,
    DenseMoments,
    DenseStatistics,
    dense_statistics_of,
)
from ssl_rec.vocab.field_vocabulary import (
    HASHED_VALUE,
    MISSING_VALUE,
    RARE_HASHES_MAX,
    UNUSED_VALUE,
    Vocabulary,
)
from ssl_rec.vocab.model_vocabularies import VOCABULARY_FORMAT, Vocabularies
from ssl_rec.vocab.on_disk import (
    LEGACY_VOCAB_DIR_KEY,
    LEGACY_VOCAB_DIRNAME,
    VOCABULARY_FILE_KEY,
    VOCABULARY_FILENAME,
    find_vocabularies,
    legacy_vocabulary_file,
    schema_vocabularies,
)
from ssl_rec.vocab.strings import (
    frequency_order,
    hash_strings,
    hashes_contain,
    key_strings,
    string_buffers,
    string_keys,
    strings_from_buffers,
)

__all__ = [
    "DENSE_QUANTILE_BINS",
    "DENSE_STATISTICS_KEY",
    "HASHED_VALUE",
    "LEGACY_VOCAB_DIRNAME",
    "LEGACY_VOCAB_DIR_KEY",
    "MISSING_VALUE",
    "RARE_HASHES_MAX",
    "UNUSED_VALUE",
    "VOCABULARY_FILENAME",
    "VOCABULARY_FILE_KEY",
    "VOCABULARY_FORMAT",
    "CodedColumn",
    "DenseMoments",
    "DenseStatistics",
    "Vocabularies",
    "Vocabulary",
    "count_values",
    "dense_statistics_of",
    "find_vocabularies",
    "frequency_order",
    "hash_strings",
    "hashes_contain",
    "key_strings",
    "legacy_vocabulary_file",
    "merge_counts",
    "schema_vocabularies",
    "string_buffers",
    "string_keys",
    "strings_from_buffers",
]
