#!/usr/bin/env python3
"""make_npy_fixtures.py — writes the .npy fixtures of tests/test_npy.c and the fuzz seeds.

Every fixture is a small file that numpy wrote (np.save, np.lib.format.write_array with an
explicit version, write_array_header_1_0) or, for the layouts numpy never writes itself
(keys in another order, bad headers), a header written by hand in numpy's framing. The
manifest tests/npy/fixtures/MANIFEST lists each file with what the reader must do with it:

    ok NAME DTYPE SHAPE [bf16] [same]   must load, with this dtype (f32 f16 bf16 bool) and
                                        shape ("3,4", "-" for 0-d); the data is PATTERN below.
                                        bf16: only with allow_bf16 (and is refused without it,
                                        naming --dtype bf16). same: npy_save of the same array
                                        must reproduce the file byte for byte.
    reject NAME TEXT...                 must be refused, with TEXT in the message.

PATTERN, element i in C order: v = ((7 * i) % 23) * 0.25 - 2.5 for f32, f16 and bf16 (exact
in all three; bf16 files hold the upper 16 bits of the float32), and i % 3 == 0 for bool.

The seed corpora of the fuzz targets are written too: tests/fuzz/corpus/npy_header/ gets
each fixture as is, tests/fuzz/corpus/npy_load/ each fixture plus one byte (the target's
parameter byte: 1 = allow bf16). Both only gain or overwrite files named seed_*; crashers
added there by hand are kept.

Regenerate (deterministic; numpy >= 1.24 for its header padding):
    python3 tests/npy/make_npy_fixtures.py                 # a python3 that has numpy
    python3 tests/npy/make_npy_fixtures.py --python /path/to/venv/bin/python
"""

import argparse
import io
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", help="run this script with that interpreter (one with numpy)")
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures"), help="fixture directory")
    ap.add_argument("--corpus", default=os.path.join(ROOT, "tests", "fuzz", "corpus"),
                    help="fuzz corpus directory (npy_header/ and npy_load/ below it)")
    return ap.parse_args()


ARGS = parse_args()
if ARGS.python and os.path.abspath(ARGS.python) != os.path.abspath(sys.executable):
    argv = [ARGS.python, os.path.abspath(__file__), "--out", ARGS.out, "--corpus", ARGS.corpus]
    os.execv(ARGS.python, argv)

try:
    import numpy as np
except ImportError:
    sys.exit("make_npy_fixtures.py needs numpy: run it with --python PATH/TO/python that has "
             "numpy (for example a virtual environment with `pip install numpy`)")

fmt = np.lib.format
MAGIC = b"\x93NUMPY"
ROWS = []  # manifest lines
FILES = {}  # name -> bytes


def pattern(shape, dtype):
    """The PATTERN of the module docstring as an array of the storage dtype."""
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    i = np.arange(n, dtype=np.int64)
    if dtype == "bool":
        return (i % 3 == 0).reshape(shape)
    v = (((7 * i) % 23) * 0.25 - 2.5).astype(np.float32).reshape(shape)
    if dtype == "f32":
        return v
    if dtype == "f16":
        return v.astype(np.float16)
    if dtype == "bf16":  # the upper half of each float32, as uint16
        return (v.view(np.uint32) >> 16).astype(np.uint16)
    raise ValueError(dtype)


def saved(arr, **kw):
    """The bytes np.save (or write_array with kw) writes for arr."""
    b = io.BytesIO()
    if kw:
        fmt.write_array(b, arr, **kw)
    else:
        np.save(b, arr, allow_pickle=False)
    return b.getvalue()


def raw(header, data=b"", version=(1, 0), align=True):
    """A file with a hand-written header text, framed as numpy frames it (padding with spaces
    to a multiple of 64 and a final newline unless align is False)."""
    h = header.encode("utf-8") if isinstance(header, str) else header
    prefix = 10 if version[0] == 1 else 12
    if align:
        h += b" " * (64 - (prefix + len(h) + 1) % 64) + b"\n"
    size = struct.pack("<H" if version[0] == 1 else "<I", len(h))
    return MAGIC + bytes(version) + size + h + data


def shape_str(shape):
    return ",".join(str(s) for s in shape) if shape else "-"


def ok(name, data, dtype, shape, bf16=False, same=False):
    FILES[name] = data
    flags = (" bf16" if bf16 else "") + (" same" if same else "")
    ROWS.append(f"ok {name} {dtype} {shape_str(shape)}{flags}")


def reject(name, data, text):
    FILES[name] = data
    ROWS.append(f"reject {name} {text}")


SHAPES = [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 2)]
NP_DTYPE = {"f32": "<f4", "f16": "<f2", "bool": "|b1"}


def accepted():
    for dt in ("f32", "f16", "bool"):
        for shape in SHAPES:
            ok(f"{dt}_r{len(shape)}.npy", saved(pattern(shape, dt)), dt, shape, same=True)
    a = pattern((2, 3), "f32")
    ok("f32_v2.npy", saved(a, version=(2, 0)), "f32", (2, 3))
    ok("f32_v3.npy", saved(a, version=(3, 0)), "f32", (2, 3))
    ok("f16_v3.npy", saved(pattern((4,), "f16"), version=(3, 0)), "f16", (4,))
    ok("f32_empty.npy", saved(pattern((0,), "f32")), "f32", (0,), same=True)
    ok("f32_zero_mid.npy", saved(pattern((2, 0, 3), "f32")), "f32", (2, 0, 3), same=True)
    big = (1, 1, 1, 1, 1, 1, 2, 3)
    ok("f32_r8.npy", saved(pattern(big, "f32")), "f32", big, same=True)

    data = pattern((2, 3), "f32").tobytes()
    ok("keys_reordered.npy",
       raw("{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}", data), "f32", (2, 3))
    ok("keys_double_quoted.npy",
       raw('{ "fortran_order" : False ,\n "shape" : ( 2 , 3 , ) ,"descr":"<f4" , }', data),
       "f32", (2, 3))
    ok("header_unaligned.npy",
       raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}\n", data, align=False),
       "f32", (2, 3))
    ok("empty_tuple_spaces.npy",
       raw("{'descr': '<f4', 'fortran_order': False, 'shape': ( ), }",
           pattern((), "f32").tobytes()), "f32", ())

    # bfloat16 bit patterns: '<V2' (ml_dtypes' descr, framed by numpy itself), '|V2' (numpy's
    # view as 'V2') and '<u2' (a torch bfloat16 tensor viewed as uint16).
    bits = pattern((2, 3), "bf16")
    b = io.BytesIO()
    fmt.write_array_header_1_0(b, {"descr": "<V2", "fortran_order": False, "shape": (2, 3)})
    ok("bf16_V2.npy", b.getvalue() + bits.tobytes(), "bf16", (2, 3), bf16=True, same=True)
    ok("bf16_voidview.npy", saved(bits.view("V2")), "bf16", (2, 3), bf16=True)
    ok("bf16_u2.npy", saved(bits), "bf16", (2, 3), bf16=True)


def rejected():
    a = pattern((2, 3), "f32")
    good = saved(a)
    reject("pickle.npy", saved(np.array([{"a": 1}, None], dtype=object), allow_pickle=True),
           "pickles are refused for safety")
    reject("big_endian.npy", saved(a.astype(">f4")), "big-endian data (dtype '>f4'); "
           "convert with arr.astype('<f4')")
    reject("big_endian_f2.npy", saved(a.astype(">f2")), "arr.astype('<f2')")
    reject("fortran.npy", saved(np.asfortranarray(pattern((3, 4), "f32"))),
           "Fortran order is not supported; save np.ascontiguousarray(arr)")
    reject("float64.npy", saved(a.astype(np.float64)), "'<f8' (float64) is not supported")
    reject("int32.npy", saved(a.astype(np.int32)), "'<i4' (int32) is not supported; accepted:")
    reject("complex64.npy", saved(a.astype(np.complex64)), "(complex64) is not supported")
    reject("unicode.npy", saved(np.array(["ab", "c"])), "(unicode strings) is not supported")
    reject("u2_without_bf16.npy", saved(pattern((2, 3), "bf16")),
           "pass --dtype bf16 to read 2-byte raw values as bfloat16")
    reject("truncated.npy", good[:-3], "truncated .npy file: shape (2, 3) needs 24 bytes")
    reject("trailing.npy", good + b"junk", "4 unexpected bytes after the data")
    reject("bad_magic.npy", b"\x93NUMPX" + good[6:], "not a .npy file")
    reject("text_file.npy", b"1.0 2.0 3.0\n", "not a .npy file")
    reject("empty.npy", b"", "empty file")
    reject("magic_only.npy", good[:8], "truncated .npy file")
    reject("version9.npy", good[:6] + b"\x09\x00" + good[8:], "version 9.0")
    reject("version1_1.npy", good[:6] + b"\x01\x01" + good[8:], "version 1.1")
    reject("header_beyond.npy", good[:8] + struct.pack("<H", 1000) + good[10:100],
           "the header is 1000 bytes long, but the file ends")
    reject("header_too_long.npy", MAGIC + b"\x02\x00" + struct.pack("<I", 70000) + b"{" * 60,
           "over the limit of 65536 bytes")
    reject("huge_shape.npy",
           raw(f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({2**40}, {2**40}), }}"),
           "is too large: the product of its non-zero extents")
    reject("zero_times_huge.npy",
           raw(f"{{'descr': '<f4', 'fortran_order': False, 'shape': (0, {2**62}, 4), }}"),
           "is too large")
    reject("extent_overflow.npy",
           raw("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"),
           "exceeds INT64_MAX")
    reject("dims9.npy", saved(np.zeros((1,) * 9, np.float32)), "9 dimensions; at most 8")
    d = pattern((2, 3), "f32").tobytes()
    reject("missing_key.npy", raw("{'descr': '<f4', 'shape': (2, 3), }", d),
           "the key 'fortran_order' is missing")
    reject("duplicate_key.npy",
           raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'shape': (2, 3)}", d),
           "duplicate key 'shape'")
    reject("unknown_key.npy",
           raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", d),
           "unknown key 'x'")
    reject("nonascii.npy",
           raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } \u00e9", d,
               version=(3, 0)), "only ASCII text is accepted")
    reject("nul_in_header.npy",
           raw(b"{'descr': '<f4', 'fortran_order': False,\x00 'shape': (2, 3), }", d),
           "only ASCII text is accepted")
    reject("no_newline.npy",
           raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }   ", d,
               align=False), "does not end with a newline")
    reject("shape_not_tuple.npy",
           raw("{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", d),
           "must be written (N,), not (N)")
    reject("shape_negative.npy",
           raw("{'descr': '<f4', 'fortran_order': False, 'shape': (-6,), }", d),
           "negative extent")
    reject("shape_list.npy",
           raw("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", d),
           "must be a tuple")
    reject("fortran_int.npy",
           raw("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", d),
           "'fortran_order' must be True or False")
    reject("structured.npy", saved(np.zeros(2, dtype=[("a", "<f4"), ("b", "<f4")])),
           "structured dtypes")
    reject("native_order.npy",
           raw("{'descr': 'f4', 'fortran_order': False, 'shape': (2, 3), }", d),
           "no explicit byte order")
    reject("text_after_dict.npy",
           raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } x", d),
           "unexpected text after the dictionary")
    b = io.BytesIO()
    np.savez(b, a=np.zeros(1, np.float32))
    reject("archive.npz", b.getvalue(), "is a .npz archive")


def crafted():
    """A few extra fuzz seeds at the edges the fixtures do not reach (not in the MANIFEST)."""
    head = "{'descr': '|b1', 'fortran_order': False, 'shape': (9223372036854775807,), }"
    return {
        "crafted_int64_max_bool.npy": raw(head),
        "crafted_8d_long_digits.npy":
            raw("{'descr': '<f2', 'fortran_order': False, 'shape': "
                "(0, 123456789012345678, 1, 1, 1, 1, 1, 7), }"),
        "crafted_whitespace.npy":
            raw("\t{\r\n'shape'\t:\n(\n2\n,\n)\n,'descr':\"<f4\",'fortran_order':False}",
                b"\0\0\x80\x3f\0\0\0\x40"),
        "crafted_v3_min.npy":
            raw("{'descr':'<V2','fortran_order':False,'shape':()}", b"\x80\x3f", version=(3, 0)),
        "crafted_v2_unaligned.npy":
            raw("{'descr':'|b1','fortran_order':False,'shape':(3,)}\n", b"\x01\x00\x01",
                version=(2, 0), align=False),
    }


def write_all():
    os.makedirs(ARGS.out, exist_ok=True)
    for name in os.listdir(ARGS.out):  # the fixture directory is ours alone
        os.remove(os.path.join(ARGS.out, name))
    for name, data in FILES.items():
        with open(os.path.join(ARGS.out, name), "wb") as f:
            f.write(data)
    with open(os.path.join(ARGS.out, "MANIFEST"), "w") as f:
        f.write("# Written by tests/npy/make_npy_fixtures.py (numpy %s); the format is described "
                "there.\n" % np.__version__)
        f.write("\n".join(ROWS) + "\n")
    header_dir = os.path.join(ARGS.corpus, "npy_header")
    load_dir = os.path.join(ARGS.corpus, "npy_load")
    os.makedirs(header_dir, exist_ok=True)
    os.makedirs(load_dir, exist_ok=True)
    bf16_names = {r.split()[1] for r in ROWS if r.startswith("ok ") and " bf16" in r}
    bf16_names.add("crafted_v3_min.npy")
    for name, data in list(FILES.items()) + list(crafted().items()):
        with open(os.path.join(header_dir, "seed_" + name), "wb") as f:
            f.write(data)
        with open(os.path.join(load_dir, "seed_" + name), "wb") as f:
            f.write(data + (b"\x01" if name in bf16_names else b"\x00"))
    total = sum(len(d) for d in FILES.values())
    print(f"wrote {len(FILES)} fixtures ({total} bytes) and MANIFEST to {ARGS.out}, "
          f"seeds to {ARGS.corpus}")


accepted()
rejected()
write_all()
