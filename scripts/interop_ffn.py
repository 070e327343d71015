#!/usr/bin/env python3
"""PyTorch side of `make test-python-interop`.

Loads a moehost checkpoint of the ffn expert into hivemind's
FeedforwardBlock with load_state_dict(strict=True), runs it on the input the
Go test sent to the server's Forward, and compares with the server's output.

Debian 12 has no python3-safetensors, so the file is read by hand: an
8-byte little-endian header length, a JSON header, then raw little-endian
tensor bytes, which torch.frombuffer views.

Usage: interop_ffn.py CHECKPOINT X.bin Y.bin HIDDEN
X.bin and Y.bin hold float32 [N, HIDDEN] little-endian. Exit status 0 when
max|torch - server| / max|server| <= 1e-5.
"""
import json
import struct
import sys

import torch

from hivemind_ffn import FeedforwardBlock  # beside this script


DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    metadata = header.pop("__metadata__", {})
    body = bytearray(data[8 + n :])
    tensors = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        t = torch.frombuffer(body, dtype=DTYPES[e["dtype"]], count=(end - begin) // torch.tensor([], dtype=DTYPES[e["dtype"]]).element_size(), offset=begin)
        tensors[name] = t.reshape(e["shape"]).clone()
    return tensors, metadata


def read_f32(path, hidden):
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(-1, hidden)


def main():
    ckpt, xpath, ypath, hidden = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    state, meta = read_safetensors(ckpt)
    block = FeedforwardBlock(hidden)
    block.load_state_dict(state, strict=True)
    x, want = read_f32(xpath, hidden), read_f32(ypath, hidden)
    with torch.no_grad():
        got = block(x)
    err = (got - want).abs().max().item() / want.abs().max().item()
    print(f"torch {torch.__version__}: checkpoint {meta.get('uid')} step {meta.get('step')}, "
          f"{len(state)} tensors loaded with strict=True; max|torch - server| / max|server| = {err:.3g}")
    sys.exit(0 if err <= 1e-5 else 1)


if __name__ == "__main__":
    main()
