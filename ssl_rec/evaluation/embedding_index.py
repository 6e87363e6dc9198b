"""EmbeddingIndex: reopen an export and answer k-nearest queries by vector or raw value."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from ssl_rec._paths import inside
from ssl_rec.evaluation.faiss_index import METRICS, set_search_params
from ssl_rec.evaluation.manifest import MANIFEST_FILENAME, Manifest, VectorSet
from ssl_rec.evaluation.vector_store import decode_vectors
from ssl_rec.vocab import Vocabularies


@dataclass
class _LoadedSet:
    info: VectorSet
    vectors: np.ndarray
    keys: np.ndarray
    labels: np.ndarray | None
    index: faiss.Index
    positions: dict[str, int] | None = None

    def position(self, raw_value: object) -> int:
        if self.positions is None:
            self.positions = {}
            for i, key in enumerate(self.keys.tolist()):
                self.positions.setdefault(str(key), i)
        key = str(raw_value)
        if key not in self.positions:
            raise KeyError(
                f"unknown raw value {raw_value!r} in {self.info.kind} set {self.info.name!r} "
                f"({self.info.count} values, e.g. {self.keys[:3].tolist()})"
            )
        return self.positions[key]


class EmbeddingIndex:
    """A loaded export (see :func:`export_embeddings`): vectors, keys and FAISS indexes.

    Scores follow the export's metric: inner products (higher is closer) for ``ip``,
    squared L2 distances (lower is closer) for ``l2``.

    Example:
        >>> idx = EmbeddingIndex.load("runs/export")  # doctest: +SKIP
        >>> values, scores = idx.neighbors("C1", "05db9164", k=5)  # doctest: +SKIP

    """

    def __init__(self, directory: Path, manifest: Manifest, sets: dict[str, _LoadedSet]) -> None:
        self.directory = directory
        self.manifest = manifest
        self._sets = sets
        self._vocabulary: Vocabularies | None = None

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> EmbeddingIndex:
        """Open an export directory; ``ValueError``/``FileNotFoundError`` say what is wrong.

        Every file is checked against the manifest's checksums as it is read (a
        :class:`~ssl_rec._io.ChecksumError` names a changed file; ``SSL_REC_VERIFY=0``
        skips the check).
        """
        directory = Path(directory)
        manifest = Manifest.read(directory)
        _check_file_names(directory, manifest)
        sets = {name: _load_set(directory, info, manifest) for name, info in manifest.sets.items()}
        return cls(directory, manifest, sets)

    @property
    def set_names(self) -> list[str]:
        """Names of the exported sets (field names and ``split_<split>``)."""
        return list(self._sets)

    @property
    def metric(self) -> str:
        """``ip`` or ``l2``."""
        return self.manifest.metric

    @property
    def vocabulary(self) -> Vocabularies | None:
        """The model's vocabularies (raw value -> id per field), or ``None`` if not exported."""
        if self._vocabulary is None and self.manifest.vocabulary:
            self.manifest.verify(self.directory, self.manifest.vocabulary)
            file = inside(self.directory, self.manifest.vocabulary,
                          self.directory / MANIFEST_FILENAME)  # fmt: skip
            self._vocabulary = Vocabularies.load(file)
        return self._vocabulary

    def vectors(self, name: str) -> np.ndarray:
        """All stored vectors of set ``name``, decoded: ``float32[n, d]``."""
        return self._get(name).vectors

    def keys(self, name: str) -> np.ndarray:
        """Raw values (``str[n]``, entity sets) or row ids (``int64[n]``) of set ``name``."""
        return self._get(name).keys

    def labels(self, name: str) -> np.ndarray | None:
        """Labels ``float32[n]`` of a representation set, or ``None``."""
        return self._get(name).labels

    def search(
        self, vectors: np.ndarray, k: int, name: str | None = None, exact: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Find the ``k`` nearest stored vectors of each query.

        Args:
            vectors: ``float32[n, d]`` queries (normalise them yourself if the export did).
            k: neighbours per query (``1 <= k``; at most the set size).
            name: set to search; may be omitted when the export holds one set.
            exact: brute-force search over the decoded vectors instead of the index.

        Returns:
            ``(scores float32[n, k], keys [n, k])``: raw values for entity sets, row ids for
            representation sets; positions the index could not fill hold ``-1`` scores keyed
            ``None``.

        """
        loaded = self._get(name)
        scores, positions = self._search_positions(loaded, vectors, k, exact)
        keys = np.empty(positions.shape, dtype=object)
        found = positions >= 0
        keys[found] = loaded.keys[positions[found]]
        keys[~found] = None
        return scores, keys

    def neighbors(self, field: str, raw_value: object, k: int = 10) -> tuple[list, np.ndarray]:
        """Find the ``k`` entities of ``field`` nearest to entity ``raw_value`` (not itself).

        Returns:
            ``(raw_values list[k], scores float32[k])``, nearest first.

        """
        loaded = self._entity(field)
        me = loaded.position(raw_value)
        scores, positions = self._search_positions(loaded, loaded.vectors[me : me + 1], k + 1)
        keep = (positions[0] != me) & (positions[0] >= 0)
        pos, sc = positions[0][keep][:k], scores[0][keep][:k]
        return loaded.keys[pos].tolist(), sc

    def vector(self, field: str, raw_value: object) -> np.ndarray:
        """Return the stored vector ``float32[d]`` of entity ``raw_value`` of ``field``."""
        loaded = self._entity(field)
        return loaded.vectors[loaded.position(raw_value)].copy()

    def _search_positions(
        self, loaded: _LoadedSet, vectors: np.ndarray, k: int, exact: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(vectors, dtype=np.float32)
        if q.ndim == 1:
            q = q[None]
        if q.ndim != 2 or q.shape[1] != loaded.info.dim:
            raise ValueError(
                f"queries have shape {tuple(vectors.shape)}; set {loaded.info.name!r} holds "
                f"vectors of dimension {loaded.info.dim}, so queries must be [n, {loaded.info.dim}]"
            )
        if not isinstance(k, int | np.integer) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        k = min(int(k), loaded.info.count)
        index = loaded.index
        if exact:
            index = faiss.IndexFlat(loaded.info.dim, METRICS[self.metric])
            index.add(loaded.vectors)
        return index.search(q, k)

    def _get(self, name: str | None) -> _LoadedSet:
        if name is None:
            if len(self._sets) != 1:
                raise ValueError(f"export holds several sets {self.set_names}; pass name=")
            return next(iter(self._sets.values()))
        if name not in self._sets:
            raise KeyError(f"no set {name!r} in export {self.directory}; sets are {self.set_names}")
        return self._sets[name]

    def _entity(self, field: str) -> _LoadedSet:
        loaded = self._get(field)
        if loaded.info.kind != "entity":
            raise ValueError(f"set {field!r} holds {loaded.info.kind}s, not field entities")
        return loaded


def _check_file_names(directory: Path, manifest: Manifest) -> None:
    """Refuse a manifest naming any file outside ``directory`` before anything is read."""
    where = directory / MANIFEST_FILENAME
    if not all(isinstance(info.files, dict) for info in manifest.sets.values()):
        raise ValueError(f"{where}: malformed manifest (a set's files are not a mapping)")
    names = [name for info in manifest.sets.values() for name in info.files.values()]
    for name in [*names, *([manifest.vocabulary] if manifest.vocabulary else [])]:
        inside(directory, name, where)


def _load_set(directory: Path, info: VectorSet, manifest: Manifest) -> _LoadedSet:
    def path(role: str) -> Path:
        if role not in info.files:
            raise ValueError(f"manifest set {info.name!r} names no {role!r} file")
        p = inside(directory, info.files[role], directory / MANIFEST_FILENAME)
        if not p.is_file():
            raise FileNotFoundError(f"{p} listed in the manifest is missing")
        manifest.verify(directory, info.files[role])
        return p

    quantizer = np.load(path("quantizer")) if "quantizer" in info.files else None
    vectors = decode_vectors(np.load(path("vectors")), manifest.precision, quantizer)
    keys = np.load(path("keys"), allow_pickle=False)
    labels = np.load(path("labels")) if "labels" in info.files else None
    index = faiss.read_index(str(path("index")))
    if (
        vectors.shape != (info.count, info.dim)
        or len(keys) != info.count
        or index.ntotal != info.count
    ):
        raise ValueError(
            f"set {info.name!r}: manifest says {info.count} x {info.dim} but files hold vectors "
            f"{vectors.shape}, {len(keys)} keys and an index of {index.ntotal} (corrupt export)"
        )
    if index.d != info.dim:
        raise ValueError(f"set {info.name!r}: index dimension {index.d} != manifest dim {info.dim}")
    set_search_params(index, info.index.get("search_params", {}))
    return _LoadedSet(info, vectors, keys, labels, index)
