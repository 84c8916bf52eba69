#!/usr/bin/env python3
"""Writes the hand-made seed inputs of tests/fuzz/corpus/<target>/.

  python3 tests/fuzz/make_seeds.py

Seeds are named seed-*; entries the fuzzer found are named by their SHA-1
(libFuzzer's naming) and are kept as they are. Each seed is small: a tiny
valid input and near misses of it (truncated, wrong magic, bad sizes, ...).
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# ---- IDX ---------------------------------------------------------------------
def idx(dims, data=None, typ=0x08, magic=b"\0\0"):
    n = 1
    for d in dims:
        n *= d
    if data is None:
        data = bytes(i % 251 for i in range(n))
    return magic + bytes([typ, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data


good3 = idx([2, 3, 4])
write("idx", "images-2x3x4", good3)
write("idx", "labels-5", idx([5], bytes([0, 1, 9, 3, 7])))
write("idx", "4d", idx([1, 2, 1, 2]))
write("idx", "truncated-data", good3[:-5])
write("idx", "truncated-header", good3[:9])
write("idx", "trailing-bytes", good3 + b"xyz")
write("idx", "wrong-magic", b"\x1f\x8b" + good3[2:])
write("idx", "wrong-type-float", idx([2, 2], bytes(16), typ=0x0D))
write("idx", "zero-dims", b"\0\0\x08\x00")
write("idx", "five-dims", b"\0\0\x08\x05" + struct.pack(">5I", 1, 1, 1, 1, 1) + b"\x00")
write("idx", "zero-dim", idx([3, 0], b""))
write("idx", "huge-dims", b"\0\0\x08\x03" + struct.pack(">3I", 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF))
write("idx", "dim-over-int", b"\0\0\x08\x01" + struct.pack(">I", 0x80000000))
write("idx", "empty", b"")
write("idx", "three-bytes", b"\0\0\x08")


# ---- safetensors -------------------------------------------------------------
def st(header, data=b"", pad=True, hlen=None):
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    n = len(h) if hlen is None else hlen
    return struct.pack("<Q", n) + h + data


f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
meta = {"format": "dtrain-weights", "dtrain_version": "0.1.0", "name": "seed"}
two = {
    "__metadata__": meta,
    "0.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "0.bias": {"dtype": "F32", "shape": [2], "data_offsets": [24, 32]},
}
write("safetensors", "valid-two", st(two, f32 + struct.pack("<2f", 7, 8)))
write("safetensors", "valid-dtypes", st({
    "a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
    "b": {"dtype": "BF16", "shape": [1, 1], "data_offsets": [4, 6]},
    "c": {"dtype": "I32", "shape": [], "data_offsets": [6, 10]},
    "d": {"dtype": "I64", "shape": [1], "data_offsets": [10, 18]},
    "e": {"dtype": "U8", "shape": [0, 5], "data_offsets": [18, 18]},
}, bytes(range(18))))
write("safetensors", "valid-empty", st({}))
write("safetensors", "truncated-data", st(two, f32)[:-3])
write("safetensors", "truncated-header", st(two, f32)[:20])
write("safetensors", "short", b"\x10\0\0")
write("safetensors", "header-len-huge", st(two, f32, hlen=1 << 40))
write("safetensors", "header-len-zero", st(two, f32, hlen=0))
write("safetensors", "bad-json", st(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]', bytes(4)))
write("safetensors", "json-array", st(b"[1, 2, 3]"))
write("safetensors", "offsets-past-end", st({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8)))
write("safetensors", "offsets-reversed", st({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}}, bytes(8)))
write("safetensors", "offsets-negative", st({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, bytes(8)))
write("safetensors", "offsets-fraction", st({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0.5, 4.5]}}, bytes(8)))
write("safetensors", "offsets-strings", st({"w": {"dtype": "U8", "shape": [1], "data_offsets": ["0", "1"]}}, bytes(1)))
write("safetensors", "overlap", st({
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
}, bytes(12)))
write("safetensors", "shape-mismatch", st({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)))
write("safetensors", "dtype-mismatch", st({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)))
write("safetensors", "dtype-unknown", st({"w": {"dtype": "F8", "shape": [2], "data_offsets": [0, 2]}}, bytes(2)))
write("safetensors", "shape-overflow", st({"w": {"dtype": "U8", "shape": [281474976710656, 65536], "data_offsets": [0, 0]}}))
write("safetensors", "shape-9-dims", st({"w": {"dtype": "U8", "shape": [1] * 9, "data_offsets": [0, 1]}}, bytes(1)))
write("safetensors", "duplicate-name", st(
    b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)))
write("safetensors", "meta-not-strings", st({"__metadata__": {"k": 1}}))
write("safetensors", "tensor-not-object", st({"w": [1, 2]}))

# ---- configs -----------------------------------------------------------------
mlp = open(os.path.join(HERE, "..", "..", "configs", "fashion-mlp.ini")).read()
cnn = open(os.path.join(HERE, "..", "..", "configs", "fashion-cnn.ini")).read()
write("config", "fashion-mlp.ini", mlp)
write("config", "fashion-cnn.ini", cnn)
write("config", "empty.ini", "")
write("config", "layers.ini", "[model]\ninput = 784\nlayer = linear out=32\nlayer = gelu\n"
      "layer = layernorm eps=1e-5\nlayer = dropout p=0.1\nlayer = linear out=10\n"
      "[train]\nmax_steps = 5\nepochs = 0\nseed = 18000000000000000000\n")
write("config", "unknown-section.ini", "[model]\npreset = mlp\n[trian]\nbatch = 3\n")
write("config", "unknown-key.ini", "[model]\npreset = mlp\n[train]\nbatchsize = 3\n")
write("config", "bad-number.ini", "[model]\npreset = mlp\n[optim]\nlr = 0.0.1\n")
write("config", "huge-number.ini", "[model]\npreset = mlp\n[train]\nmax_steps = 1e400\nbatch = 99999999999999999999\n")
write("config", "bad-bool.ini", "[model]\npreset = mlp\n[data]\nshuffle = maybe\n")
write("config", "bad-layer.ini", "[model]\nlayer = conv2d out=32 kernel=-5\n")
write("config", "preset-and-layers.ini", "[model]\npreset = cnn\nlayer = relu\n")
write("config", "syntax.ini", "[model\npreset = mlp\n")
write("config", "no-equals.ini", "[model]\npreset mlp\n")
write("config", "long-line.ini", "[data]\ndir = /" + "d" * 400 + "\n[model]\npreset = mlp\n")
write("config", "crlf-bom.ini", "\ufeff[model]\r\npreset = mlp ; inline\r\n[train]\r\nbatch: 8\r\n")
write("config", "multiline.ini", "[model]\ninput = 1x28x28\nlayer = flatten\n  linear out=10\n")
write("config", "override.ini", "[model]\npreset = mlp\n\0train.batch=32")
write("config", "override-bad.ini", "[model]\npreset = mlp\n\0trainbatch32")
write("config", "override-layer.ini", "[model]\npreset = mlp\n\0model.layer=relu")
write("config", "input-trailing-x.ini", "[model]\ninput = 1x28x28x\npreset = mlp\n")
write("config", "input-huge.ini", "[model]\ninput = 1048576x1048576x1048576\npreset = mlp\n")
write("config", "seed-float.ini", "[model]\npreset = mlp\n[train]\nseed = 1.5e3\n")
write("config", "roundtrip.ini", "[model]\ninput = 784\nlayer = dropout p=0.418447137\nlayer = linear out=10\n"
      "layer = layernorm eps=3.3333e-7\n[data]\ndir = /a;b c\n[train]\nseed = 12345678901234567890\n")
write("config", "comment-value.ini", "[model]\npreset = mlp\n[data]\ndir =; /data\n")
write("config", "min-lr.ini", "[model]\npreset = mlp\n[schedule]\nmin_lr = 5\n")

# ---- HDF5 reader's checks (fuzz_hdf5.c: two 70-byte descriptions, then
# labels and pixels) ----------------------------------------------------------
def h5desc(found=1, is_dataset=1, cls=0, size=1, signed=0, dims=(4, 2, 3)):
    d = list(dims) + [0] * (8 - len(dims))
    return bytes([found, is_dataset, cls, size, signed, len(dims) & 0xFF]) + struct.pack("<8q", *d)


def h5(images, labels, rest=b""):
    return images + labels + rest


good_rest = bytes([0, 9, 3, 1]) + bytes(range(24))
write("hdf5", "good", h5(h5desc(), h5desc(dims=(4,)), good_rest))
write("hdf5", "good-4d", h5(h5desc(dims=(2, 3, 2, 2)), h5desc(size=8, signed=1, dims=(2,)), bytes([1, 2]) + bytes(24)))
write("hdf5", "label-10", h5(h5desc(), h5desc(dims=(4,)), bytes([0, 10, 3, 1]) + bytes(24)))
write("hdf5", "label-neg", h5(h5desc(), h5desc(dims=(4,)), bytes([0, 0xFF, 3, 1]) + bytes(24)))
write("hdf5", "missing", h5(h5desc(found=0), h5desc(dims=(4,))))
write("hdf5", "group", h5(h5desc(), h5desc(is_dataset=0, dims=(4,))))
write("hdf5", "float-images", h5(h5desc(cls=1, size=4), h5desc(dims=(4,))))
write("hdf5", "flat-images", h5(h5desc(dims=(4, 6)), h5desc(dims=(4,))))
write("hdf5", "count-mismatch", h5(h5desc(), h5desc(dims=(5,))))
write("hdf5", "huge", h5(h5desc(dims=(1 << 30, 1 << 30, 2)), h5desc(dims=(1 << 30,))))
write("hdf5", "zero-dim", h5(h5desc(dims=(4, 0, 3)), h5desc(dims=(4,))))
write("hdf5", "negative-ndim", h5(h5desc(dims=()), h5desc(dims=(4,)))[:5] + b"\xff" + h5desc(dims=(4,))[6:] + h5desc(dims=(4,)))
