"""safetensors files between Tandem and a writer and reader of this script's own (the standard
library only: struct and json), both directions:

1. This script writes a file (F32, F16 and BF16 tensors, a scalar, an empty tensor, metadata,
   a header padded with spaces) as the format describes it; safetensors_copy reads it and
   prints each tensor, which must be the values written (f16 and bf16 widened exactly).
2. safetensors_copy writes the tensors back as F32; this script parses that file by the
   format's rules (header length, JSON header, data_offsets tiling the buffer, little-endian
   f32) and checks every name, shape and value, and the metadata.
3. Bad files this script makes are refused with one line naming the problem.

Usage: safetensors_format_test.py SAFETENSORS_COPY TMPDIR
"""
import json
import os
import struct
import subprocess
import sys


def f32(x):
    """x rounded to the nearest f32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_bits(x):
    """The bf16 of an f32 that bf16 holds exactly: its upper 16 bits."""
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


# name -> (dtype, shape, values); every value exact in its dtype.
TENSORS = {
    "transformer.wte.weight": ("F32", [2, 3], [0.5, -1.25, 3.0e-3, 1e20, -0.0, 7.0]),
    "h.0.half": ("F16", [4], [1.0, -2.5, 0.099975586, 65504.0]),
    "h.0.brain": ("BF16", [2, 2], [1.0, -3.5, 0.015625, 1.5 * 2.0**100]),
    "scalar": ("F32", [], [42.0]),
    "empty": ("F32", [0, 5], []),
}


def pack(dtype, values):
    if dtype == "F32":
        return struct.pack("<%df" % len(values), *values)
    if dtype == "F16":
        return struct.pack("<%de" % len(values), *values)
    return struct.pack("<%dH" % len(values), *[bf16_bits(v) for v in values])


def write_file(path, tensors, metadata, pad=True):
    header, data = {"__metadata__": metadata}, b""
    for name, (dtype, shape, values) in tensors.items():
        raw = pack(dtype, values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8 + 8)  # trailing spaces are allowed
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header length past the end"
    text = raw[8:8 + n]
    assert text[:1] == b"{", "header does not start with {"
    header = json.loads(text.decode())
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {})
    spans, out = [], {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        assert info["dtype"] == "F32", (name, info["dtype"])
        count = 1
        for d in info["shape"]:
            count *= d
        assert end - begin == 4 * count, (name, begin, end, info["shape"])
        spans.append((begin, end))
        out[name] = (info["shape"], list(struct.unpack("<%df" % count, data[begin:end])))
    spans.sort()
    pos = 0
    for begin, end in spans:
        if begin == end:
            continue
        assert begin == pos, "hole or overlap at byte %d" % begin
        pos = end
    assert pos == len(data), "bytes after the last tensor"
    assert (8 + n) % 8 == 0, "data not 8-byte aligned: header of %d bytes" % n
    return metadata, out


def main():
    copy, tmp = sys.argv[1], sys.argv[2]
    src, dst = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
    write_file(src, TENSORS, {"format": "pt", "note": "written by the test"})
    run = subprocess.run([copy, src, dst], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    printed = {}
    for line in run.stdout.splitlines():
        t = json.loads(line)
        printed[t["name"]] = t
    assert set(printed) == set(TENSORS), sorted(printed)
    for name, (dtype, shape, values) in TENSORS.items():
        t = printed[name]
        assert t["dtype"] == dtype and t["shape"] == shape, (name, t)
        got = [f32(v) for v in t["values"]]
        assert got == [f32(v) for v in values], (name, got, values)
    print("1. Tandem read every tensor this script wrote: names, dtypes, shapes, values")

    metadata, tensors = read_file(dst)
    assert metadata == {"format": "pt", "note": "written by the test", "copied_by": "tandem"}, metadata
    assert set(tensors) == set(TENSORS), sorted(tensors)
    for name, (dtype, shape, values) in TENSORS.items():
        assert tensors[name] == (shape, [f32(v) for v in values]), (name, tensors[name])
    print("2. this script read every tensor Tandem wrote, as f32, with the metadata")

    def refused(label, raw, words):
        path = os.path.join(tmp, "bad.safetensors")
        with open(path, "wb") as f:
            f.write(raw)
        r = subprocess.run([copy, path, dst], capture_output=True, text=True)
        msg = r.stderr.strip()
        assert r.returncode != 0, label
        assert "\n" not in msg and "bad.safetensors" in msg and words in msg, (label, msg)
        print("   refused (%s): %s" % (label, msg))

    good = open(src, "rb").read()
    (n,) = struct.unpack("<Q", good[:8])
    refused("header length", struct.pack("<Q", len(good)) + good[8:], "header length")
    refused("truncated", good[:-2], "")
    header = json.loads(good[8:8 + n].decode())

    def with_header(h, data=good[8 + n:]):
        text = json.dumps(h).encode()
        return struct.pack("<Q", len(text)) + text + data

    h = json.loads(json.dumps(header))
    h["scalar"]["dtype"] = "I64"
    refused("unknown dtype", with_header(h), "dtype I64")
    h = json.loads(json.dumps(header))
    h["h.0.half"]["shape"] = [5]
    refused("shape against offsets", with_header(h), "h.0.half")
    h = json.loads(json.dumps(header))
    b, e = h["scalar"]["data_offsets"]
    h["scalar"]["data_offsets"] = [b - 4, e - 4]
    refused("overlap", with_header(h), "overlaps")
    h = json.loads(json.dumps(header))
    h["scalar"]["data_offsets"] = [b + 10**6, e + 10**6]
    refused("out of range", with_header(h), "outside")
    refused("hole", with_header(header, good[8 + n:] + b"\0" * 8), "belong to no tensor")
    print("3. bad files refused in one line each")


if __name__ == "__main__":
    main()
