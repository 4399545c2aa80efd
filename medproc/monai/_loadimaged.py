"""``LoadImaged``'s arguments that :class:`~medproc.monai.LoadVolumed` has no use for: refused
by name with what to do (a tutorial's call moved over as it is got a bare TypeError)."""

from __future__ import annotations

__all__ = ["check_loadimaged_kwargs"]


#: LoadImaged's arguments that LoadVolumed has no use for, and why (a tutorial's call, moved
#: over as it is, got a bare TypeError)
_LOADIMAGED = {
    "reader": "medproc's own readers read every format (DICOM, NIfTI, NRRD, MHA)",
    "meta_keys": "the metadata travels on each MetaTensor's .meta",
    "meta_key_postfix": "the metadata travels on each MetaTensor's .meta, where MONAI's box and "
    "inverse transforms read it ('<key>_meta_dict' under set_track_meta(False))",
    "overwriting": "the metadata travels on each MetaTensor's .meta",
    "simple_keys": "LoadVolumed writes LoadImaged's keys",
    "prune_meta_pattern": "LoadVolumed writes no NIfTI header fields to prune",
    "prune_meta_sep": "LoadVolumed writes no NIfTI header fields to prune",
    "expanduser": "paths are read as given: expand '~' in the datalist",
}


#: values of those arguments that change nothing (LoadImaged's defaults): accepted
_NO_EFFECT = {"reader": None, "meta_key_postfix": "meta_dict", "overwriting": False,
              "simple_keys": False, "meta_keys": None}  # fmt: skip


def check_loadimaged_kwargs(kwargs: dict, own) -> None:
    """Refuse ``LoadImaged``-only arguments that would change something, saying what to do
    instead (their defaults are accepted, as ``ensure_channel_first=True`` is); any other
    unknown one with the closest of ``own`` (LoadVolumed's parameters)."""
    import difflib

    for name, value in kwargs.items():
        if name in _NO_EFFECT and _NO_EFFECT[name] == value:
            continue
        if name in _LOADIMAGED:
            raise TypeError(
                f"LoadVolumed does not take LoadImaged's {name}={value!r}: "
                f"{_LOADIMAGED[name]}; drop the argument"
            )
        near = difflib.get_close_matches(name, list(own), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise TypeError(f"LoadVolumed got an unexpected keyword argument {name!r}{hint}")
