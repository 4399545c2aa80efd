"""Lesion annotations in world coordinates, and their readers.

Convention: RAS millimetres internally (like every affine in medproc). Formats that store LPS
(LUNA16 CSV, DICOM SEG/RTSTRUCT, JSON with ``"coordinate_system": "LPS"``) are converted on
input. An annotation never stores voxel indices: its voxel position on any grid is computed from
that grid's affine, so every geometric step that moves voxels moves it by the same matrix.
"""

from .lesions import Lesions
from .luna import read_luna_csv
from .readers import read_json, read_rtstruct, read_seg

__all__ = ["Lesions", "read_luna_csv", "read_json", "read_seg", "read_rtstruct"]
