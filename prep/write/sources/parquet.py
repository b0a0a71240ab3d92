"""Parquet, streamed one row group at a time with pyarrow; columns of types JSON cannot carry are refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prep.errors import PrepError
from prep.write.sources import Record, Reject, Source


def unsupported_type(data_type: object) -> str | None:
    """None if values of this arrow type become plain Python values (numbers, text, bytes, lists, dicts);
    else the type's name."""
    import pyarrow as pa

    types = pa.types
    if (
        types.is_null(data_type)
        or types.is_boolean(data_type)
        or types.is_integer(data_type)
        or types.is_floating(data_type)
        or types.is_string(data_type)
        or types.is_large_string(data_type)
        or types.is_binary(data_type)
        or types.is_large_binary(data_type)
        or types.is_fixed_size_binary(data_type)
    ):
        return None
    if types.is_list(data_type) or types.is_large_list(data_type) or types.is_fixed_size_list(data_type):
        return unsupported_type(data_type.value_type)
    if types.is_struct(data_type):
        for index in range(data_type.num_fields):
            if unsupported_type(data_type.field(index).type) is not None:
                return str(data_type)
        return None
    return str(data_type)


class ParquetSource:
    """Records from a Parquet file; `columns` limits what is read (None: all)."""

    default_parts = "json-row"

    def __init__(self, path: Path, columns: list[str] | None = None) -> None:
        self.path = path
        self.name = str(path)
        self.paths = [path]
        self.columns = columns

    @classmethod
    def open(cls, paths: list[Path], columns: list[str] | None = None) -> list[Source]:
        return [cls(path, columns) for path in paths]

    def records(self) -> Iterator[Record | Reject]:
        parquet = self.open_file()
        row = 0
        for group in range(parquet.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            yield from self.rows(parquet, group, 0, rows, row)
            row += rows

    def open_file(self) -> Any:
        """The file as a `pyarrow.parquet.ParquetFile`, or a PrepError saying why it cannot be read."""
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise PrepError("Reading Parquet needs pyarrow: pip install pyarrow.") from None
        try:
            return pq.ParquetFile(self.path)
        except Exception as error:  # pyarrow raises its own error types for unreadable files
            raise PrepError(f"{self.name}: not a readable Parquet file ({error}).") from None

    def rows(
        self, parquet: Any, group: int, start: int, stop: int, rows_before: int
    ) -> Iterator[Record | Reject]:
        """The records of rows `start` to `stop` of row group `group`, after `rows_before` rows of the
        file (which name them); `prep.write.blocks` reads a block of a file with it."""
        schema = parquet.schema_arrow
        columns = [name for name in (self.columns or schema.names) if name in schema.names]
        bad = {name: kind for name in columns if (kind := unsupported_type(schema.field(name).type))}
        base = self.path.parent
        row = rows_before
        try:
            table = parquet.read_row_group(group, columns=columns)
        except Exception as error:  # a damaged page or footer: pyarrow's OSError or ArrowException
            raise PrepError(
                f"{self.name}: row group {group} (after row {row}) cannot be read: {error}. The file is"
                " damaged or was cut short; write it again from its source."
            ) from None
        if start or stop < table.num_rows:
            table = table.slice(start, stop - start)
        if bad:
            reason = "; ".join(
                f"column {name!r} has type {kind}, which has no JSON form" for name, kind in bad.items()
            )
            for _ in range(table.num_rows):
                row += 1
                yield Reject(f"{self.name}:row {row}", f"{reason} (cast it, or leave it out with --part)")
            return
        try:
            records = table.to_pylist()
        except UnicodeDecodeError:  # a damaged string: pyarrow checks UTF-8 only when it makes the str
            records = None
        for number in range(table.num_rows):
            row += 1
            try:
                fields = records[number] if records is not None else table.slice(number, 1).to_pylist()[0]
            except UnicodeDecodeError as error:
                yield Reject(f"{self.name}:row {row}", f"a string that is not UTF-8 ({error.reason})")
                continue
            yield Record(fields, f"{self.name}:row {row}", base=base)
