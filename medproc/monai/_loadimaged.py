"""MONAI's arguments that medproc's transforms take another way: ``LoadImaged``'s refused by
:class:`~medproc.monai.LoadVolumed`, ``Spacingd``'s and ``Orientationd``'s by
:class:`~medproc.monai.Resampled`, by name with what to do (a tutorial's call moved over as it
is got a bare TypeError)."""

from __future__ import annotations

__all__ = ["check_loadimaged_kwargs", "check_spacingd_kwargs"]


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


#: Spacingd's and Orientationd's arguments, and where Resampled takes what they say
_SPACINGD = {
    "pixdim": "the output spacing is the Spec's: Resampled(keys, Spec(spacing=pixdim, "
    "grid='monai')) (where pixdim has a value <= 0, MONAI keeps that axis's input spacing: "
    "give the spacing it has)",
    "axcodes": "the orientation is the Spec's: Spec(orientation=axcodes)",
    "padding_mode": "outside the input the border voxel is repeated (MONAI's 'border'), or the "
    "Spec's fill value is written (Spec(fill=0) for 'zeros')",
    "align_corners": "the output grid is the Spec's: Spec(grid='monai') gives Spacingd's grid "
    "(align_corners=False), the default grid='centred' keeps the field of view centred",
    "dtype": "images take the Spec's dtype (Spec(dtype=...)); label maps keep theirs",
    "diagonal": "an oblique input keeps its axes, as with diagonal=False (Spec(orientation=...) "
    "permutes and flips them, as Orientationd does); there is no axis-aligned regridding",
    "scale_extent": "the output grid is the Spec's (grid='monai' or 'centred')",
    "recompute_affine": "the output affine is always the exact grid's",
    "min_pixdim": "give the spacing in the Spec",
    "max_pixdim": "give the spacing in the Spec",
    "ensure_same_shape": "the keys must share one grid (a label off its image's grid is refused)",
    "labels": "axis codes name RAS directions, as nibabel's and MONAI's defaults do",
    "as_closest_canonical": "the orientation is the Spec's: Spec(orientation='RAS')",
    "lazy": "Resampled resamples when called (its plan is one matrix: nothing to fuse)",
}
#: the arguments above that are Orientationd's (named so in the messages)
_ORIENTATIOND = {"axcodes", "labels", "as_closest_canonical"}

#: values of those arguments that change nothing (the defaults medproc follows): accepted
_SPACINGD_NO_EFFECT = {"padding_mode": "border", "align_corners": False, "dtype": None,
                       "diagonal": False, "scale_extent": False, "recompute_affine": False,
                       "min_pixdim": None, "max_pixdim": None, "ensure_same_shape": True,
                       "axcodes": None, "labels": None, "as_closest_canonical": False,
                       "lazy": False}  # fmt: skip


def check_loadimaged_kwargs(kwargs: dict, own) -> None:
    """Refuse ``LoadImaged``-only arguments that would change something, saying what to do
    instead (their defaults are accepted, as ``ensure_channel_first=True`` is); any other
    unknown one with the closest of ``own`` (LoadVolumed's parameters, ``inspect``'s)."""
    _check("LoadVolumed", lambda n: "LoadImaged's", kwargs, own, _LOADIMAGED, _NO_EFFECT)


def check_spacingd_kwargs(kwargs: dict, own) -> None:
    """The same for :class:`~medproc.monai.Resampled` and the arguments of ``Spacingd`` and
    ``Orientationd`` (the Spec holds what they say)."""

    def whose(n):
        return "Orientationd's" if n in _ORIENTATIOND else "Spacingd's"

    _check("Resampled", whose, kwargs, own, _SPACINGD, _SPACINGD_NO_EFFECT)


def _check(who: str, whose, kwargs: dict, own, table: dict, no_effect: dict) -> None:
    import difflib

    for name, value in kwargs.items():
        if name in no_effect and no_effect[name] == value:
            continue
        if name in table:
            raise TypeError(
                f"{who} does not take {whose(name)} {name}={value!r}: {table[name]}; drop the "
                "argument"
            )
        names = [n for n, p in own.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        near = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise TypeError(f"{who} got an unexpected keyword argument {name!r}{hint}")
