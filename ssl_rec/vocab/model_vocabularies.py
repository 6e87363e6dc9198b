"""The vocabularies of a model: what each id of each field means, as one value.

A trained model's rows mean raw values only through the vocabularies its data was encoded
with, so :class:`Vocabularies` travels with the model: in every checkpoint (tensors, see
:meth:`Vocabularies.to_state`), and as one Arrow file (:meth:`Vocabularies.save`,
``vocabulary.arrow``) in every data cache entry, quantized model directory and export.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ssl_rec.schema import FeatureSchema
from ssl_rec.vocab.field_vocabulary import MISSING_VALUE, Vocabulary
from ssl_rec.vocab.strings import string_buffers, strings_from_buffers

VOCABULARY_FORMAT = 1


def _hashes_text(hashes: np.ndarray | None) -> str | None:
    """Base64 of little-endian ``uint64`` hashes (``None`` stays ``None``)."""
    if hashes is None:
        return None
    return base64.b64encode(np.ascontiguousarray(hashes, "<u8").tobytes()).decode("ascii")


def _hashes_array(text: str | None) -> np.ndarray | None:
    """Inverse of :func:`_hashes_text`."""
    if text is None:
        return None
    return np.frombuffer(base64.b64decode(text), "<u8").astype(np.uint64)


def _digest(vocab: Vocabulary) -> str:
    data, offsets = string_buffers(vocab.values)
    h = hashlib.blake2b(f"{vocab.cardinality}:{vocab.hashed}:".encode(), digest_size=16)
    for part in (offsets, data, vocab.ids.astype(np.int32)):
        h.update(np.ascontiguousarray(part).data)
    return h.hexdigest()


@dataclass(frozen=True)
class Vocabularies:
    """The vocabulary of every categorical field, in schema order: what a model's rows mean.

    Travels with the model: :meth:`to_state` goes into every checkpoint (tensors that
    ``torch.load(weights_only=True)`` reads: UTF-8 bytes + offsets, no Python string per
    value), :meth:`save` into every data cache entry, quantized directory and export (one
    Arrow file, ``vocabulary.arrow``). Data given
    to a trained model is encoded with it: kept values to their ids, missing, rare and
    unseen values to id 0.

    Args:
        fields: field name -> :class:`Vocabulary`, in field order.
        min_frequency: the ``min_frequency`` the vocabularies were fit with.
        max_vocab_size: the ``max_vocab_size`` they were fit with (``None``: no hashing).

    Example:
        >>> from ssl_rec.vocab import CodedColumn
        >>> v = Vocabularies.from_id_values({"C1": pa.array(["<missing>", "a", "b"])})
        >>> v["C1"].encode(CodedColumn.from_column(pa.array(["b", None, "z"]))).tolist()
        [2, 0, 0]

    """

    fields: dict[str, Vocabulary]
    min_frequency: int = 1
    max_vocab_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", dict(self.fields))
        object.__setattr__(self, "_digests", {})

    @property
    def names(self) -> list[str]:
        """Field names in order."""
        return list(self.fields)

    @property
    def cardinalities(self) -> list[int]:
        """Ids per field (including id 0), in order."""
        return [int(v.cardinality) for v in self.fields.values()]

    def __getitem__(self, name: str) -> Vocabulary:
        """The vocabulary of field ``name`` (``KeyError`` naming the known fields)."""
        if name not in self.fields:
            raise KeyError(f"no vocabulary for field {name!r}; fields are {self.names}")
        return self.fields[name]

    def fingerprint(self, name: str) -> str:
        """Content hash of one field's vocabulary (values, ids, cardinality); cached."""
        digests = self._digests  # type: ignore[attr-defined]
        if name not in digests:
            digests[name] = _digest(self[name])
        return digests[name]

    def fingerprints(self) -> dict[str, str]:
        """``field -> fingerprint`` of every field."""
        return {name: self.fingerprint(name) for name in self.fields}

    def disagreeing(self, other: Mapping[str, str] | Vocabularies) -> list[str]:
        """Fields whose vocabulary differs from ``other`` (fingerprints or vocabularies)."""
        theirs = other.fingerprints() if isinstance(other, Vocabularies) else dict(other)
        names = [*self.fields, *(n for n in theirs if n not in self.fields)]
        return [n for n in names if n not in theirs or n not in self.fields
                or theirs[n] != self.fingerprint(n)]  # fmt: skip

    def check_schema(self, schema: FeatureSchema, where: str = "vocabulary") -> None:
        """Raise ``ValueError`` unless fields and cardinalities equal the schema's."""
        mine = dict(zip(self.names, self.cardinalities, strict=True))
        theirs = dict(zip(schema.field_names, schema.cardinalities, strict=True))
        if mine != theirs:
            bad = sorted(n for n in {*mine, *theirs} if mine.get(n) != theirs.get(n))
            raise ValueError(
                f"{where}: fields {bad} differ from the schema (vocabulary "
                f"{[mine.get(n) for n in bad]} ids vs schema {[theirs.get(n) for n in bad]})"
            )

    def id_values(self, name: str) -> pa.Array:
        """Raw value of every id of ``name`` (id 0 = ``"<missing>"``, unused = ``"<unused>"``).

        Every bucket of a hashed field is ``"<hashed>"``.
        """
        values = self[name].id_values()
        if pa.types.is_dictionary(values.type):  # a hashed field: "<hashed>" per bucket
            values = values.dictionary_decode()
        return pa.concat_arrays([pa.array([MISSING_VALUE], pa.string()), values[1:]])

    @classmethod
    def from_id_values(cls, fields: Mapping[str, pa.Array]) -> Vocabularies:
        """Vocabularies whose id ``i`` is ``values[i]`` (index 0, the missing id, is ignored)."""
        out = {}
        for name, values in fields.items():
            n = len(values)
            out[name] = Vocabulary(values[1:], np.arange(1, n, dtype=np.int32), n, False)
        return cls(out)

    def to_state(self) -> dict[str, Any]:
        """Plain values and tensors for a checkpoint (``torch.load(weights_only=True)`` reads it).

        Per field: ``data uint8[bytes]``, ``offsets int32|int64[U + 1]``, ``ids int32[U]``
        (hashed fields only: otherwise ids are ``1..U``), ``cardinality``, ``hashed``, and
        where recorded ``rare_count`` and ``rare_hashes int64[R]`` (the uint64 hashes of the
        values rarer than ``min_frequency`` in training, bit for bit).
        """
        import torch

        fields = {}
        for name, vocab in self.fields.items():
            data, offsets = string_buffers(vocab.values)
            small = offsets[-1] < np.iinfo(np.int32).max
            entry = {
                "data": torch.from_numpy(data.copy()),
                "offsets": torch.from_numpy(offsets.astype(np.int32 if small else np.int64)),
                "cardinality": int(vocab.cardinality),
                "hashed": bool(vocab.hashed),
                "fingerprint": self.fingerprint(name),
            }
            if vocab.hashed:
                entry["ids"] = torch.from_numpy(vocab.ids.astype(np.int32))
            if vocab.rare_count is not None:
                entry["rare_count"] = int(vocab.rare_count)
            if vocab.rare_hashes is not None:
                hashes = np.ascontiguousarray(vocab.rare_hashes, np.uint64).view(np.int64)
                entry["rare_hashes"] = torch.from_numpy(hashes.copy())
            fields[name] = entry
        options = {"min_frequency": self.min_frequency, "max_vocab_size": self.max_vocab_size}
        return {"format": VOCABULARY_FORMAT, "names": self.names, "fields": fields, **options}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], where: str = "checkpoint") -> Vocabularies:
        """Rebuild from :meth:`to_state`; ``ValueError`` naming ``where`` if malformed."""
        if not isinstance(state, Mapping) or state.get("format") != VOCABULARY_FORMAT:
            raise ValueError(f"{where}: vocabulary of an unknown format (expected format "
                             f"{VOCABULARY_FORMAT})")  # fmt: skip
        out, digests = {}, {}
        try:
            for name in state["names"]:
                entry = state["fields"][name]
                values = strings_from_buffers(entry["data"].numpy(), entry["offsets"].numpy())
                n = len(values)
                ids = entry["ids"].numpy() if entry["hashed"] else np.arange(1, n + 1)
                card = int(entry["cardinality"])
                rare = entry.get("rare_hashes")
                out[name] = Vocabulary(
                    values, ids.astype(np.int32), card, bool(entry["hashed"]),
                    None if entry.get("rare_count") is None else int(entry["rare_count"]),
                    None if rare is None else rare.numpy().astype(np.int64).view(np.uint64),
                )  # fmt: skip
                digests[name] = entry.get("fingerprint")
        except (KeyError, TypeError, AttributeError, pa.ArrowException) as e:
            raise ValueError(f"{where}: malformed vocabulary ({type(e).__name__}: {e})") from e
        vocab = cls(out, int(state["min_frequency"]), state["max_vocab_size"])
        vocab._digests.update({k: v for k, v in digests.items() if v})  # type: ignore[attr-defined]
        return vocab

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write one Arrow IPC file: ``field`` (dictionary-encoded), ``value``, ``id`` columns.

        One record batch per field, in order; options and cardinalities are in the schema
        metadata (key ``ssl_rec``), so other tools can read it without this package. So are
        the counts of values rarer than ``min_frequency`` in training and their hashes
        (``rare_counts``, ``rare_hashes``: base64 of little-endian uint64s), where recorded.
        """
        meta = {"format": VOCABULARY_FORMAT, "min_frequency": self.min_frequency,
                "max_vocab_size": self.max_vocab_size, "names": self.names,
                "cardinalities": self.cardinalities,
                "hashed": [bool(v.hashed) for v in self.fields.values()],
                "rare_counts": [v.rare_count for v in self.fields.values()],
                "rare_hashes": [_hashes_text(v.rare_hashes)
                                for v in self.fields.values()]}  # fmt: skip
        names = pa.array(self.names, pa.string())
        schema = pa.schema(
            [("field", pa.dictionary(pa.int16(), pa.string())), ("value", pa.large_string()),
             ("id", pa.int32())],
            metadata={"ssl_rec": json.dumps(meta)},
        )  # fmt: skip
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for i, vocab in enumerate(self.fields.values()):
                n = len(vocab.values)
                field = pa.DictionaryArray.from_arrays(pa.array(np.full(n, i, np.int16)), names)
                values = pc.cast(vocab.values, pa.large_string())
                columns = [field, values, pa.array(vocab.ids.astype(np.int32))]
                writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=schema))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Vocabularies:
        """Read a file written by :meth:`save` (``FileNotFoundError`` / ``ValueError``)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no vocabulary file at {path}")
        try:
            with pa.memory_map(str(path)) as source:
                reader = pa.ipc.open_file(source)
                meta = json.loads(reader.schema.metadata[b"ssl_rec"])
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except (pa.ArrowException, KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a vocabulary file ({type(e).__name__}: {e})") from e
        if meta.get("format") != VOCABULARY_FORMAT:
            raise ValueError(f"{path}: vocabulary format {meta.get('format')!r} is not supported")
        parts: dict[str, list[pa.RecordBatch]] = {name: [] for name in meta["names"]}
        for batch in batches:
            field = batch.column(0)
            codes = np.unique(field.indices.to_numpy())
            for code in codes:
                rows = batch if len(codes) == 1 else batch.filter(
                    pc.equal(field.indices, pa.scalar(code, field.indices.type)))  # fmt: skip
                parts[field.dictionary[int(code)].as_py()].append(rows)
        fields = {}
        n = len(meta["names"])
        rare_counts = meta.get("rare_counts") or [None] * n
        rare_hashes = meta.get("rare_hashes") or [None] * n
        try:
            rare = [(None if c is None else int(c), _hashes_array(h))
                    for c, h in zip(rare_counts, rare_hashes, strict=True)]  # fmt: skip
            if len(rare) != n:
                raise ValueError(f"{len(rare)} entries for {n} fields")
        except (ValueError, TypeError) as e:  # binascii.Error is a ValueError
            raise ValueError(f"{path}: malformed rare values ({type(e).__name__}: {e})") from e
        for name, card, hashed, (rare_count, hashes) in zip(
            meta["names"], meta["cardinalities"], meta["hashed"], rare, strict=True
        ):
            rows = pa.Table.from_batches(parts[name], batches[0].schema if batches else None)
            ids = rows.column("id").to_numpy().astype(np.int32)
            fields[name] = Vocabulary(rows.column("value").combine_chunks(), ids, card, hashed,
                                      rare_count, hashes)  # fmt: skip
        return cls(fields, int(meta["min_frequency"]), meta["max_vocab_size"])
