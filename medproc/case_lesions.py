"""Which lesions of an annotation table belong to which case: by SeriesInstanceUID, else by the
image's file stem or name; and the cases whose key names another case too, or that are listed
under two keys."""

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
    would both get ``case001``'s lesions; and for cases the table lists under two of their keys
    (the series UID and the folder's name)."""
    if table is None:
        return {}
    by_key: dict = {}
    out = {}
    for c in cases:
        keys = list(dict.fromkeys(k for k in _lesion_keys(c) if k and k in table))
        if len(keys) > 1:  # (the first key's lesions were used, the others' dropped unsaid)
            out[c.source] = (
                f"the annotations list this image under {len(keys)} keys "
                f"({', '.join(map(repr, keys))}): which lesions are its own is not known; "
                "list each image under one key (a DICOM series by its SeriesInstanceUID)"
            )
        if keys:
            by_key.setdefault(keys[0], []).append(c.source)
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
