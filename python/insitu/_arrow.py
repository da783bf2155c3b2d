"""The pyarrow side of ``Client.sql``, ``Table.insert_arrow`` and ``Table.schema``.

Data crosses to and from the native module as Arrow IPC streams (``bytes``),
so the native module links no pyarrow and any pyarrow version works. pyarrow
is needed only for these calls: without it they raise an ImportError that
says how to install it.
"""

from __future__ import annotations

from typing import Any, Iterator


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401  (the submodule is not always loaded by `import pyarrow`)
    except ImportError as e:
        raise ImportError(
            "this call needs pyarrow: pip install pyarrow "
            "(or install the client with its extra: pip install './python[arrow]')"
        ) from e
    return pa


def table_from_ipc(data: bytes) -> Any:
    """A ``pyarrow.Table`` of an IPC stream; its buffers point into ``data``
    (read in place, not copied)."""
    pa = _pyarrow()
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def schema_from_ipc(data: bytes) -> Any:
    """The ``pyarrow.Schema`` of an IPC stream."""
    pa = _pyarrow()
    return pa.ipc.open_stream(pa.py_buffer(data)).schema


def _record_batches(data: Any, pa: Any) -> Iterator[Any]:
    """Every record batch of ``data``: a Table, a RecordBatch, a
    RecordBatchReader, a pandas DataFrame, a dict of columns, anything with
    the Arrow C stream interface, or an iterable of RecordBatches."""
    if isinstance(data, pa.RecordBatch):
        yield data
    elif isinstance(data, pa.Table):
        yield from data.to_batches()
    elif isinstance(data, pa.RecordBatchReader):
        yield from data
    elif isinstance(data, dict) or hasattr(data, "__arrow_c_stream__") or \
            type(data).__name__ == "DataFrame":
        yield from pa.table(data).to_batches()
    else:
        try:
            items = iter(data)
        except TypeError:
            raise TypeError(
                "insert_arrow takes a pyarrow Table, RecordBatch or RecordBatchReader, "
                f"a pandas DataFrame, a dict of columns or an iterable of RecordBatches, "
                f"not {type(data).__name__}"
            ) from None
        for b in items:
            if not isinstance(b, pa.RecordBatch):
                raise TypeError(
                    f"insert_arrow: an iterable must hold pyarrow RecordBatches, "
                    f"not {type(b).__name__}"
                )
            yield b


def batches(data: Any, max_rows: int) -> Iterator[bytes]:
    """``data`` as IPC streams of at most ``max_rows`` rows each (slices
    share the input's buffers; each stream is written only when asked for)."""
    pa = _pyarrow()
    for batch in _record_batches(data, pa):
        for start in range(0, batch.num_rows, max_rows):
            part = batch.slice(start, max_rows)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.schema) as writer:
                writer.write_batch(part)
            yield sink.getvalue().to_pybytes()


def _type_text(name: str, t: Any, pa: Any) -> str:
    """The insitu column type of pyarrow type ``t`` (``--schema`` spelling)."""
    types = pa.types
    if types.is_int8(t) or types.is_int16(t) or types.is_int32(t) or \
            types.is_uint8(t) or types.is_uint16(t):
        return "int32"
    if types.is_int64(t) or types.is_uint32(t):
        return "int64"
    if types.is_floating(t):
        return "float64"
    if types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if types.is_date32(t):
        return "date32"
    if types.is_string(t) or types.is_large_string(t) or \
            (hasattr(types, "is_string_view") and types.is_string_view(t)):
        return "utf8"
    if types.is_boolean(t):
        return "bool"
    raise TypeError(
        f"column {name!r}: pyarrow type {t} has no insitu column type "
        "(int32, int64, float64, decimal(P,S), date32, utf8, bool)"
    )


def schema_columns(schema: Any) -> list[tuple[str, str, bool]]:
    """(name, insitu type, nullable) per field of a ``pyarrow.Schema``."""
    pa = _pyarrow()
    if not isinstance(schema, pa.Schema):
        raise TypeError(
            "schema must be a str ('id int64, name utf8 null') or a pyarrow.Schema, "
            f"not {type(schema).__name__}"
        )
    return [(f.name, _type_text(f.name, f.type, pa), f.nullable) for f in schema]
