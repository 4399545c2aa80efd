"""Small text tables (CSV case lists, lesion CSVs) read strictly: UTF-8 only, no NUL bytes,
the required columns present, and every malformed line named in a :class:`ReadError`."""

from __future__ import annotations

import csv
import io

from ..errors import ReadError
from .safety import check_file, os_error

__all__ = ["read_text", "read_csv_rows", "MAX_TABLE_BYTES"]

#: a case list or lesion table larger than this is not one
MAX_TABLE_BYTES = 1 << 28


def read_text(path: str) -> str:
    """A UTF-8 text file (never a FIFO or a device); a ReadError naming the line of the first
    byte that is not UTF-8."""
    size = check_file(path).st_size
    if size > MAX_TABLE_BYTES:
        raise ReadError(
            f"is {size} bytes: more than the {MAX_TABLE_BYTES} a table may have (is it really "
            "a CSV/JSON table?)",
            path,
        )
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise os_error(e, path) from None
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):  # (was "Latin-1 or binary?")
        raise ReadError(
            "is UTF-16 text (its first bytes say so; Excel's 'Unicode Text' is saved so): "
            "save it as UTF-8",
            path,
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ReadError(
            f"is not UTF-8 text (byte 0x{raw[e.start]:02x} cannot be decoded; Latin-1 or "
            "binary?). Save it as UTF-8",
            path,
            where=f"line {line}",
        ) from None


def read_csv_rows(path: str, need: tuple, what: str):
    """``(line number, row dict)`` of a UTF-8 CSV with the columns ``need``; malformed files
    raise :class:`ReadError` naming the line."""
    text = read_text(path)
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise ReadError(f"holds NUL bytes: not a {what} (binary?)", path, where=f"line {line}")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        fields = [(h or "").strip() for h in (reader.fieldnames or [])]
        reader.fieldnames = fields
        missing = [c for c in need if c not in fields]
        if missing:
            raise ReadError(
                f"missing column(s) {missing}: a {what} needs a header with {list(need)}, "
                f"found {fields[:8]}. Add the header line",
                path,
                where="line 1",
            )
        twice = sorted({c for c in fields if c and fields.count(c) > 1})
        if twice:  # (DictReader would keep the last of them silently)
            raise ReadError(
                f"the column(s) {twice} appear more than once in the header: which one holds "
                "the values is ambiguous. Keep one of each",
                path,
                where="line 1",
            )
        for line, row in enumerate(reader, 2):
            at = reader.line_num if reader.line_num else line
            extra = [x for x in row.pop(None, None) or [] if (x or "").strip()]
            if extra:  # (DictReader would drop them silently)
                raise ReadError(
                    f"more cells than the header has columns ({len(fields)}), extra "
                    f"{extra[:3]}: a comma inside a value? quote it, or fix the header",
                    path,
                    where=f"line {at}",
                )
            yield at, row
    except csv.Error as e:
        at = reader.line_num
        if "field limit" in str(e):  # (the reader had not counted that line yet)
            limit = csv.field_size_limit()
            rest = text.split("\n")[at:]  # (from the first line not read whole)
            at = next((n for n, x in enumerate(rest, at + 1) if len(x) > limit), at + 1)
        raise ReadError(
            f"is not a valid CSV ({e}); fix that line", path, where=f"line {at}"
        ) from None
