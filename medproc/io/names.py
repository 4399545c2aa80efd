"""Output naming templates (``medproc convert --name``): plain ``{field}`` replacement only.

A template is text with fields in braces, e.g. ``"{modality}_{stem}"``. Anything else that
:meth:`str.format` would do is refused: attribute or index access (``{name.__class__}``,
``{name[0]}``), positional fields (``{}``, ``{0}``), conversions (``{name!r}``) and format
specs (``{series_number:03d}``), so a template never reaches into Python objects; and an empty
template (it would name every case ``case``).
"""

from __future__ import annotations

import string
from collections.abc import Mapping

from ..errors import UsageError

__all__ = ["format_name"]


def _fields_of(template: str, known: Mapping) -> list[str]:
    """The field names of ``template``; raises :class:`UsageError` for anything but a plain
    ``{field}`` of ``known``."""
    hint = "use fields in braces, e.g. '{name}' or '{modality}_{stem}'"
    if not template.strip():
        raise UsageError(f"naming template {template!r} is empty; {hint}")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise UsageError(f"naming template {template!r} is malformed ({e}); {hint}") from None
    names = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue  # (literal text only)
        if name.isidentifier() and not spec and conversion is None:
            if name not in known:
                raise UsageError(
                    f"naming template {template!r} uses unknown field {name!r}; fields: "
                    f"{sorted(known)}"
                )
            names.append(name)
            continue
        whole = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
        raise UsageError(
            f"naming template {template!r}: {whole + '}'!r} is not a plain field; a template "
            f"holds fields as {{field}} only (no attribute, index, conversion or format), of "
            f"{sorted(known)}"
        )
    return names


def format_name(template: str, fields: Mapping) -> str:
    """``template`` with its ``{field}``s replaced by ``fields``' values (as text).

    >>> format_name("{modality}_{stem}", {"modality": "CT", "stem": "a"})
    'CT_a'
    """
    _fields_of(template, fields)
    out = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is not None:
            out.append(str(fields[name]))
    return "".join(out)
