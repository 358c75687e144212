"""Writes valid safetensors files into the folder given, the fuzzer's starting points: every dtype, metadata, rank 0,
an empty tensor, several tensors (plain Python: the format is a length, JSON and bytes)."""
import json
import pathlib
import struct
import sys

SIZES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I32": 4, "I64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def file_of(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape) in sorted(tensors.items()):
        count = 1
        for d in shape:
            count *= d
        raw = bytes((i * 37 + 11) % 256 for i in range(count * SIZES[dtype]))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def main(folder):
    out = pathlib.Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    seeds = {
        "every_dtype": file_of({d.lower(): (d, [2, 3]) for d in SIZES}),
        "metadata": file_of({"w": ("F32", [4])}, {"format": "pt", "step": "12"}),
        "scalar_and_empty": file_of({"s": ("F64", []), "e": ("F32", [0, 5])}),
        "mlp": file_of({"ln.gamma": ("BF16", [8]), "fc1.kernel": ("BF16", [8, 16]), "fc2.kernel": ("BF16", [16, 8])}),
        "empty_header": file_of({}),
    }
    for name, data in seeds.items():
        (out / f"seed_{name}").write_bytes(data)


if __name__ == "__main__":
    main(sys.argv[1])
