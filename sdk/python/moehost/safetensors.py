"""A small safetensors reader for Debian machines without PyPI: numpy and
torch only. ``load_file(path)`` returns the tensors by name, as
``safetensors.torch.load_file`` does, for the files moehost writes
(checkpoints and ``moehost checkpoint export``).

The format: an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and [begin, end) byte offsets into the data
that follows, and an optional "__metadata__" of strings.
"""

import json
import struct
from typing import Dict, Tuple

import numpy as np
import torch

# The largest header accepted: the files moehost writes have a few KiB.
MAX_HEADER_BYTES = 100 << 20

_DTYPES = {
    "F64": (np.float64, None),
    "F32": (np.float32, None),
    "F16": (np.float16, None),
    "BF16": (np.int16, torch.bfloat16),  # numpy has no bfloat16: read the bits
    "I64": (np.int64, None),
    "I32": (np.int32, None),
    "I16": (np.int16, None),
    "I8": (np.int8, None),
    "U8": (np.uint8, None),
    "BOOL": (np.bool_, None),
}


def load(data: bytes) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Decodes a safetensors file's bytes into its tensors by name and its
    metadata. A malformed file raises ValueError naming the problem."""
    if len(data) < 8:
        raise ValueError("safetensors: shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(data):
        raise ValueError(f"safetensors: header length {n} does not fit a {len(data)}-byte file")
    header = json.loads(data[8:8 + n])
    if not isinstance(header, dict):
        raise ValueError("safetensors: the header is not a JSON object")
    body = memoryview(data)[8 + n:]
    metadata = header.pop("__metadata__", None) or {}
    out = {}
    for name, spec in header.items():
        dtype, shape, (begin, end) = spec["dtype"], spec["shape"], spec["data_offsets"]
        if dtype not in _DTYPES:
            raise ValueError(f"safetensors: {name!r} has dtype {dtype!r}, not one of {sorted(_DTYPES)}")
        np_dtype, view = _DTYPES[dtype]
        count = 1
        for d in shape:
            if not isinstance(d, int) or d < 0:
                raise ValueError(f"safetensors: {name!r} has shape {shape}")
            count *= d
        if not (0 <= begin <= end <= len(body)) or end - begin != count * np.dtype(np_dtype).itemsize:
            raise ValueError(f"safetensors: {name!r} at [{begin}, {end}) does not hold {dtype}{shape} in {len(body)} bytes")
        arr = np.frombuffer(body[begin:end], dtype=np.dtype(np_dtype).newbyteorder("<")).reshape(shape)
        t = torch.from_numpy(arr.astype(np_dtype, copy=True))
        out[name] = t.view(view) if view is not None else t
    return out, metadata


def load_file(path: str) -> Dict[str, torch.Tensor]:
    """The tensors of the safetensors file at path, by name: a state_dict
    for ``load_state_dict(..., strict=True)``."""
    with open(path, "rb") as f:
        return load(f.read())[0]
