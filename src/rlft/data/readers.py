"""Read rows of a dataset from .jsonl, .json, .csv or .parquet files, or from a folder written by
Hugging Face ``datasets``' ``save_to_disk``.

Every row is a ``dict``; each keeps the number a user can find it by (the line
number for line-based formats, the 1-based index for .json, .parquet and Arrow folders).  A
malformed row either stops the run with a :class:`~rlft.errors.DataError` that
names the file and line, or (``on_bad_row="skip"``) is recorded in
:attr:`ReadResult.skipped`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlft.errors import DataError

OnBadRow = Literal["error", "skip"]

#: (row number, parsed row or None, problem or None) as produced by a format reader.
_Item = tuple[int, Any, "str | None"]


@dataclass
class ReadResult:
    """The usable rows of one file.

    ``rows[i]`` was found at ``row_numbers[i]``.  ``skipped`` holds
    ``(row_number, message)`` for every bad row that was skipped; the message
    is complete (``"<file> line 7: invalid JSON (...)"``).  ``unit`` is the word
    used for row numbers in messages: ``"line"`` (.jsonl, .csv) or ``"row"``
    (.json, .parquet).
    """

    rows: list[dict]
    row_numbers: list[int]
    skipped: list[tuple[int, str]] = field(default_factory=list)
    unit: str = "line"

    def __len__(self) -> int:
        return len(self.rows)


def where(path: str | Path, unit: str, number: int) -> str:
    """The location prefix used in every data message: ``"data/train.jsonl line 7"``."""
    return f"{path} {unit} {number}"


def _jsonl_items(path: Path) -> Iterator[_Item]:
    with _open_text(path) as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                yield number, None, f"invalid JSON ({exc.msg} at column {exc.colno})"
                continue
            yield number, value, None


def _json_items(path: Path) -> Iterator[_Item]:
    with _open_text(path) as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} line {exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(
            f'{path}: expected a JSON list of objects or an object with a "data" list, got {_type_name(data)}'
        )
    for index, value in enumerate(data):
        yield index + 1, value, None


def _csv_items(path: Path) -> Iterator[_Item]:
    with _open_text(path) as fh:
        reader = csv.DictReader(fh)
        try:
            header = reader.fieldnames or []
            for row in reader:
                yield reader.line_num, row, _csv_problem(row, len(header))
        except csv.Error as exc:
            raise DataError(f"{path} line {reader.line_num}: malformed CSV ({exc})") from None


def _csv_problem(row: dict, n_header: int) -> str | None:
    if None in row:  # more fields than the header
        return f"has {n_header + len(row[None])} fields but the header has {n_header}"
    missing = sum(1 for v in row.values() if v is None)
    if missing:
        return f"has {n_header - missing} fields but the header has {n_header}"
    return None


def _parquet_items(path: Path) -> Iterator[_Item]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: cannot read Parquet file ({exc})") from None
    for index, value in enumerate(table.to_pylist()):
        yield index + 1, value, None


def _saved_dataset_items(path: Path) -> Iterator[_Item]:
    """A ``Dataset.save_to_disk`` folder: its Arrow shards in the order its state.json lists them.
    Read with pyarrow (already a dependency), so loading one does not need ``datasets`` installed."""
    import pyarrow as pa

    try:
        shards = [path / entry["filename"] for entry in json.loads((path / "state.json").read_text())["_data_files"]]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: state.json does not list the dataset's Arrow files ({exc})") from None
    number = 0
    for shard in shards:
        try:
            with pa.memory_map(str(shard)) as source:
                table = pa.ipc.open_stream(source).read_all()
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataError(f"{path}: cannot read Arrow shard {shard.name} ({exc})") from None
        for value in table.to_pylist():
            number += 1
            yield number, value, None


def _folder_reader(path: Path) -> tuple[Callable[[Path], Iterator[_Item]], str]:
    if (path / "dataset_dict.json").is_file():
        try:
            splits = [str(name) for name in json.loads((path / "dataset_dict.json").read_text())["splits"]]
        except (json.JSONDecodeError, KeyError, TypeError):
            splits = [p.name for p in sorted(path.iterdir()) if (p / "state.json").is_file()]
        raise DataError(
            f"{path}: a DatasetDict folder with the splits {', '.join(splits) or '(none)'}; point the "
            f"data file at one split's folder, e.g. {path / (splits[0] if splits else 'train')}"
        )
    if not (path / "state.json").is_file():
        raise DataError(
            f"{path}: a folder, but not a dataset written by datasets' save_to_disk (it has no "
            f"state.json); give a .jsonl, .json, .csv or .parquet file or such a folder"
        )
    return _saved_dataset_items, "row"


_READERS: dict[str, tuple[Callable[[Path], Iterator[_Item]], str]] = {
    ".jsonl": (_jsonl_items, "line"),
    ".json": (_json_items, "row"),
    ".csv": (_csv_items, "line"),
    ".parquet": (_parquet_items, "row"),
}
SUPPORTED_FORMATS = tuple(_READERS)


def read_rows(path: str | Path, on_bad_row: OnBadRow = "error") -> ReadResult:
    """Read every row of ``path`` (.jsonl, .json, .csv, .parquet or a ``save_to_disk`` folder) as a dict.

    Raises :class:`DataError` for an unknown extension, a missing or unreadable
    file, a file with no usable rows, and (with ``on_bad_row="error"``) the
    first malformed row.  With ``on_bad_row="skip"`` malformed rows are listed
    in ``ReadResult.skipped`` instead.
    """
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    p = Path(path)
    suffix = p.suffix.lower()
    if p.is_dir():
        items, unit = _folder_reader(p)
    elif suffix not in _READERS:
        raise DataError(
            f"{path}: unsupported data format '{p.suffix or '(no extension)'}'; supported formats: "
            f"{', '.join(SUPPORTED_FORMATS)} and folders written by datasets' save_to_disk"
        )
    elif not p.exists():
        raise DataError(f"{path}: data file not found")
    elif not p.is_file():
        raise DataError(f"{path}: not a file")
    else:
        items, unit = _READERS[suffix]
    result = ReadResult(rows=[], row_numbers=[], unit=unit)
    try:
        for number, value, problem in items(p):
            if problem is None and not isinstance(value, dict):
                problem = f"expected a JSON object, got {_type_name(value)}"
            if problem is None:
                result.rows.append(value)
                result.row_numbers.append(number)
                continue
            message = f"{where(path, unit, number)}: {problem}"
            if on_bad_row == "error":
                raise DataError(message)
            result.skipped.append((number, message))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not valid UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read file ({exc.strerror or exc})") from None
    if not result.rows:
        extra = f" ({len(result.skipped)} malformed rows skipped)" if result.skipped else ""
        raise DataError(f"{path}: the dataset is empty: no usable rows{extra}")
    return result


def _open_text(path: Path):
    # utf-8-sig tolerates the byte-order mark some editors (and Excel) write.
    return open(path, encoding="utf-8-sig", newline="")


def _type_name(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)
