"""Which lesions of an annotation table belong to which case: by SeriesInstanceUID, else by the
image's file stem or name; and the cases whose key names another case too."""

from __future__ import annotations

__all__ = ["lesions_for", "shared_lesion_keys"]


def lesions_for(case, table: dict | None):
    """The lesions of ``case`` in ``table`` (by SeriesInstanceUID or file stem), or none."""
    if table is None:
        return None
    from .annotations import Lesions

    return Lesions.of(table, _lesion_keys(case))


def _lesion_keys(case) -> list:
    keys = [case.dicom.uid] if case.dicom is not None else []
    return keys + [case.fields.get("stem"), case.fields.get("name")]


def shared_lesion_keys(cases, table: dict | None) -> dict:
    """``{case source: message}`` for cases whose lesions in ``table`` are found under a key
    (a file stem) that names another case too: two images called ``case001`` in two folders
    would both get ``case001``'s lesions."""
    if table is None:
        return {}
    by_key: dict = {}
    for c in cases:
        key = next((k for k in _lesion_keys(c) if k and k in table), None)
        if key is not None:
            by_key.setdefault(key, []).append(c.source)
    out = {}
    for key, sources in by_key.items():
        if len(set(sources)) > 1:
            shown = ", ".join(sorted(set(sources))[:4])
            for src in sources:
                out[src] = (
                    f"the annotations' key {key!r} names {len(set(sources))} inputs ({shown}): "
                    "their lesions would go to each; give the images distinct names (or key "
                    "DICOM series by SeriesInstanceUID)"
                )
    return out
