"""Streaming readers: record batches of a delimited text file (plain or gzip) or a Parquet file.

Memory depends on the block size, never on the file's length. Every column is read as text
(numbers are checked and converted by :mod:`ssl_rec.data.parsing`, which names file and
line); the cells listed in ``missing_values`` are null. Errors name the file: a row with the
wrong number of columns (and its line), a truncated or corrupt gzip stream, invalid UTF-8,
UTF-16 text. A UTF-8 byte-order mark at the start of a file is not part of its first cell
(Arrow's parser skips it, and so does :func:`open_text`); :func:`first_line` says so once
per file.
"""

from __future__ import annotations

import collections
import gzip
import io
import logging
import os
import queue
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

T = TypeVar("T")
U = TypeVar("U")
BLOCK_BYTES = 4 << 20
PARQUET_ROWS = 1 << 16
GZIP_MAGIC = b"\x1f\x8b"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
UTF8_BOM = b"\xef\xbb\xbf"
_EXPECTED = re.compile(r"Expected (\d+) columns, got (\d+)")
log = logging.getLogger(__name__)
_BOM_NAMED: set[str] = set()  # files whose UTF-8 byte-order mark was already named


def is_gzip(path: str | os.PathLike[str]) -> bool:
    """Whether the file starts with the gzip magic bytes (whatever its name)."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_text(path: str | os.PathLike[str]) -> io.TextIOBase:
    """Open a plain or gzip text file for reading lines (UTF-8; a leading BOM is dropped)."""
    # Spreadsheets save "CSV UTF-8" with a BOM; Arrow's parser skips it, so must the header.
    if is_gzip(path):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _starts_with(path: str | os.PathLike[str], marks: tuple[bytes, ...]) -> bool:
    """Whether the (plain or gzip) file's first bytes are one of ``marks``."""
    try:
        with gzip.open(path, "rb") if is_gzip(path) else open(path, "rb") as f:
            return f.read(max(len(m) for m in marks)).startswith(marks)
    except (OSError, EOFError):
        return False


def _name_utf8_bom(path: str | os.PathLike[str]) -> None:
    """Log, once per file, that its UTF-8 byte-order mark is not read as header text."""
    key = os.path.abspath(path)
    if key not in _BOM_NAMED and _starts_with(path, (UTF8_BOM,)):
        _BOM_NAMED.add(key)
        log.info("%s: stripped a UTF-8 byte-order mark from the header", path)


def _utf16_bom(path: str | os.PathLike[str]) -> bool:
    """Whether the (plain or gzip) file starts with a UTF-16 byte-order mark."""
    return _starts_with(path, UTF16_BOMS)


def first_line(path: str | os.PathLike[str]) -> str:
    """The file's first line without its line break ("" for an empty file).

    Raises:
        FileNotFoundError: no such file.
        ValueError: unreadable gzip or non-UTF-8 text, naming the file.

    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    try:
        with open_text(path) as f:
            line = f.readline().rstrip("\r\n")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        if _utf16_bom(path):
            raise ValueError(f"{path}: UTF-16 text (it starts with a UTF-16 byte-order mark); "
                             "save it as UTF-8") from None  # fmt: skip
        raise ValueError(f"{path}: cannot read line 1 ({e})") from None
    _name_utf8_bom(path)
    return line


@dataclass(frozen=True)
class TextFormat:
    r"""How a delimited text file is laid out.

    Args:
        delimiter: column separator (``"\\t"`` or ``","``).
        header: whether line 1 names the columns.
        quoting: honour ``"``-quoted cells (CSV); Criteo files have no quotes.
        skip_blank_lines: ignore empty lines (they would otherwise be bad rows).

    """

    delimiter: str
    header: bool
    quoting: bool = True
    skip_blank_lines: bool = True

    @property
    def first_data_line(self) -> int:
        """Line number of the first data row."""
        return 2 if self.header else 1


_NAN_SPELLINGS = ("nan", "NaN", "NAN")


def with_nan_spellings(missing: Sequence[str]) -> tuple[str, ...]:
    """``missing`` plus every spelling of :data:`_NAN_SPELLINGS` if it lists NaN in any case.

    So listing ``"nan"`` as a missing cell reads ``NaN`` and ``NAN`` as missing too.
    """
    missing = tuple(missing)
    if not any(m.lower() == "nan" for m in missing):
        return missing
    return (*missing, *(m for m in _NAN_SPELLINGS if m not in missing))


class TextBatches:
    r"""Record batches of one delimited text file, every column as nullable text.

    Args:
        path: the file (gzip detected from its first bytes).
        fmt: its layout.
        names: column names of every line (``None``: from the header line).
        columns: the columns to keep (default all).
        missing_values: cells read as null (NaN in any case where one spelling of it is
            listed: :func:`with_nan_spellings`).
        skip_bad_rows: drop rows with the wrong number of columns (counted in ``skipped``)
            instead of raising ``ValueError`` naming the line.
        dictionary: columns read dictionary-encoded (each batch's distinct values plus
            ``int32`` indices, built while parsing; the values are the same text).

    Attributes:
        skipped: rows with the wrong number of columns dropped so far.

    Example:
        >>> _ = Path("day_0.tsv").write_text("1\t5\n0\t\n")
        >>> for batch, line in TextBatches("day_0.tsv", TextFormat("\t", False), ["y", "C1"]):
        ...     print(line, batch.column("C1").to_pylist())
        1 ['5', None]

    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fmt: TextFormat,
        names: list[str] | None,
        columns: list[str] | None = None,
        missing_values: tuple[str, ...] = ("",),
        skip_bad_rows: bool = False,
        dictionary: tuple[str, ...] = (),
    ) -> None:
        self.path, self.fmt, self.names = Path(path), fmt, names
        self.dictionary = frozenset(dictionary)
        self.columns, self.missing_values = columns, list(with_nan_spellings(missing_values))
        self.skip_bad_rows = skip_bad_rows
        self.skipped = 0
        self._raw: pa.NativeFile | None = None
        self._last = 0

    def position(self) -> int:
        """Bytes of the file (compressed, for gzip) consumed so far."""
        # Called from another thread than the reader's: the file may close meanwhile.
        raw = self._raw
        try:
            if raw is not None and not raw.closed:
                self._last = raw.tell()
        except (OSError, ValueError):
            pass
        return self._last

    def _reader(self) -> pacsv.CSVStreamingReader:
        def on_invalid(row: pacsv.InvalidRow) -> str:
            if not self.skip_bad_rows:
                return "error"
            self.skipped += 1
            return "skip"

        self._raw = pa.OSFile(str(self.path))
        stream = pa.CompressedInputStream(self._raw, "gzip") if is_gzip(self.path) else self._raw
        wanted = self.columns if self.columns is not None else self.names
        text, coded = pa.string(), pa.dictionary(pa.int32(), pa.string())
        types = {name: coded if name in self.dictionary else text for name in wanted or []}
        return pacsv.open_csv(
            stream,
            read_options=pacsv.ReadOptions(
                column_names=self.names, block_size=BLOCK_BYTES, use_threads=False
            ),
            parse_options=pacsv.ParseOptions(
                delimiter=self.fmt.delimiter, quote_char='"' if self.fmt.quoting else False,
                ignore_empty_lines=self.fmt.skip_blank_lines, invalid_row_handler=on_invalid,
            ),
            convert_options=pacsv.ConvertOptions(
                include_columns=wanted, column_types=types,
                null_values=self.missing_values, strings_can_be_null=True,
            ),
        )  # fmt: skip

    def __iter__(self) -> Iterator[tuple[pa.RecordBatch, int]]:
        """Yield ``(batch, line number of its row 0)``.

        Line numbers are exact while no row has been skipped.
        """
        self.skipped, rows = 0, 0
        try:
            reader = self._open_checked()
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                except pa.ArrowInvalid as e:
                    raise self._bad_row_error(e, rows) from None
                except (OSError, EOFError) as e:
                    raise ValueError(
                        f"{self.path}: truncated or corrupt file after line {self._line(rows)} "
                        f"({e})"
                    ) from None
                yield batch, self._line(rows)
                rows += batch.num_rows
        finally:
            if self._raw is not None:
                self._raw.close()

    def _open_checked(self) -> pacsv.CSVStreamingReader:
        try:
            return self._reader()
        except pa.ArrowInvalid as e:
            raise self._bad_row_error(e, 0) from None
        except (OSError, EOFError) as e:
            raise ValueError(f"{self.path}: truncated or corrupt file ({e})") from None

    def _line(self, rows: int) -> int:
        return self.fmt.first_data_line + rows + self.skipped

    def _bad_row_error(self, error: pa.ArrowInvalid, rows: int) -> ValueError:
        text = str(error)
        match = _EXPECTED.search(text)
        if match is None:
            if "UTF8" in text or "UTF-8" in text:
                return ValueError(f"{self.path}: invalid UTF-8 text after line {self._line(rows)}")
            return ValueError(f"{self.path}: cannot parse after line {self._line(rows)}: {text}")
        expected, got = int(match[1]), int(match[2])
        line = self._find_bad_line(self._line(rows), expected)
        kind = {"\t": "tab", ",": "comma"}.get(self.fmt.delimiter, repr(self.fmt.delimiter))
        return ValueError(
            f"{self.path}, line {line}: expected {expected} {kind}-separated columns, got {got}"
        )

    def _find_bad_line(self, start: int, expected: int) -> int:
        # Error path only: pyarrow does not report the line; scan from the failing batch on.
        with open_text(self.path) as f:
            for number, line in enumerate(f, start=1):
                if number < start or (self.fmt.skip_blank_lines and not line.strip("\r\n")):
                    continue
                if line.rstrip("\r\n").count(self.fmt.delimiter) + 1 != expected:
                    return number
        return start


class ParquetBatches:
    """Record batches of one Parquet file (``columns`` only), like :class:`TextBatches`.

    Yields ``(batch, row number of its row 0)`` counted from 0; ``skipped`` stays 0.
    """

    def __init__(self, path: str | os.PathLike[str], columns: list[str]) -> None:
        self.path, self.columns = Path(path), columns
        self.skipped = 0
        self._done = 0

    def position(self) -> int:
        """Bytes of the file read so far (approximated by the row groups done)."""
        return self._done

    def __iter__(self) -> Iterator[tuple[pa.RecordBatch, int]]:
        """Yield ``(batch, first row)``."""
        file = pq.ParquetFile(self.path)
        total, rows = max(file.metadata.num_rows, 1), 0
        size = self.path.stat().st_size
        for batch in file.iter_batches(PARQUET_ROWS, columns=self.columns):
            yield batch, rows
            rows += batch.num_rows
            self._done = size * rows // total


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Iterate ``items`` in a background thread, up to ``depth`` items ahead.

    Parsing and validation run in Arrow's C++ with the GIL released, so the next batches
    are read on a second core while the caller works on the current one. An exception of
    the reader is raised here; leaving the loop early stops the reader.
    """
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop, end = threading.Event(), object()

    def put(entry: tuple) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((end, None))
        except BaseException as error:  # noqa: BLE001 - re-raised in the consumer
            put((end, error))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while True:
            item, error = slots.get()
            if item is end:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()


def ordered_map(
    fn: Callable[[T], U], items: Iterable[T], workers: int = 2, ahead: int = 4
) -> Iterator[tuple[T, U]]:
    """``(item, fn(item))`` in order, ``fn`` running on ``workers`` threads ``ahead`` items ahead.

    ``fn`` should spend its time in numpy / Arrow calls that release the GIL.
    """
    with ThreadPoolExecutor(workers) as pool:
        window: collections.deque = collections.deque()
        for item in items:
            window.append((item, pool.submit(fn, item)))
            if len(window) > ahead:
                first, future = window.popleft()
                yield first, future.result()
        while window:
            first, future = window.popleft()
            yield first, future.result()
