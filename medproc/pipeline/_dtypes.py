"""numpy <-> DALI dtypes."""

import numpy as np


def to_dali(dtype):
    from nvidia.dali import types

    table = {
        np.dtype("float32"): types.FLOAT, np.dtype("float16"): types.FLOAT16,
        np.dtype("float64"): types.FLOAT64, np.dtype("int8"): types.INT8,
        np.dtype("uint8"): types.UINT8, np.dtype("int16"): types.INT16,
        np.dtype("uint16"): types.UINT16, np.dtype("int32"): types.INT32,
        np.dtype("uint32"): types.UINT32, np.dtype("int64"): types.INT64,
    }
    try:
        return table[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"output dtype {dtype} is not supported by the pipeline") from None
