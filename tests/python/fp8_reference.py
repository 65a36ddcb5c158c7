"""Independent numpy re-implementation of Megaton's FP8 quantisation recipes (kernels/fp8_quantize.h) on a
fixed fixture matrix: per-tensor current and given scales, DeepSeek-V3's 1x128 tiles and 128x128
blocks, and MXFP8's 1x32 E8M0 blocks. Writes the expected scales and a hash of the codes; the C++
test (tests/kernels/fp8_quantize_test.cpp) compares against the committed result and
selftest_fp8_fixture.py shows the committed file is what this script computes.

Rounding here goes through float64 arithmetic and numpy's rint (round half to even) on the value's
quantum, and the code is looked up in a table of every representable value: a different route from
the C++ bit manipulation."""
import json
import math
import sys

import numpy as np

ROWS, COLS = 130, 300
FORMATS = {"e4m3": dict(exp_bits=4, man_bits=3, bias=7, max=448.0),
           "e5m2": dict(exp_bits=5, man_bits=2, bias=15, max=57344.0)}
TILES = {"1x128": (1, 128), "128x128": (128, 128), "mx1x32": (1, 32)}
CASES = [("e4m3", "tensor", False, None), ("e5m2", "tensor", False, None), ("e4m3", "tensor", False, 3.0),
         ("e4m3", "1x128", False, None), ("e4m3", "1x128", True, None), ("e4m3", "128x128", False, None),
         ("e5m2", "128x128", True, None), ("e4m3", "mx1x32", False, None), ("e5m2", "mx1x32", False, None)]


def fixture_matrix():
    """Exactly representable float32 values over a wide range: a 20-bit signed integer times a power
    of two picked by an integer hash; row 5 is all zeros (a tile whose amax is 0)."""
    m = np.zeros((ROWS, COLS), dtype=np.float32)
    for i in range(ROWS):
        for j in range(COLS):
            u = (i * 2654435761 + j * 40503 + 12345) % 2**32
            u ^= u >> 13
            u = (u * 0x5BD1E995) % 2**32
            u ^= u >> 15
            mant = (u & 0xFFFFF) - 2**19
            e = (u >> 20) % 16 - 30 + (i % 7) * 3
            m[i, j] = 0.0 if i == 5 else np.float32(math.ldexp(mant, e))
    return m


def value_table(fmt):
    f = FORMATS[fmt]
    values = {}
    for code in range(128):
        exp, man = code >> f["man_bits"], code & ((1 << f["man_bits"]) - 1)
        if fmt == "e4m3" and code == 0x7F:
            continue
        if fmt == "e5m2" and exp == (1 << f["exp_bits"]) - 1:
            continue
        if exp == 0:
            v = math.ldexp(man, 1 - f["bias"] - f["man_bits"])
        else:
            v = math.ldexp(man + (1 << f["man_bits"]), exp - f["bias"] - f["man_bits"])
        values[v] = code
    return values


def encode(v, fmt, table):
    f = FORMATS[fmt]
    a = abs(float(v))
    sign = 0x80 if math.copysign(1.0, float(v)) < 0 else 0
    if a >= f["max"]:
        return sign | table[f["max"]]
    if a == 0.0:
        return sign
    _, e = math.frexp(a)               # a = m * 2^e, m in [0.5, 1)
    e = max(e - 1, 1 - f["bias"])       # the binade, or the subnormal range
    quantum = math.ldexp(1.0, e - f["man_bits"])
    r = float(np.rint(a / quantum)) * quantum
    return sign | table[min(r, f["max"])]


def scale_from_amax(amax, fp8_max, pow2):
    if amax == 0.0 or not math.isfinite(amax):
        return np.float32(1.0)
    s = np.float32(fp8_max) / np.float32(amax)
    if pow2:
        s = np.float32(2.0 ** math.floor(math.log2(s)))
    return s


def e8m0(v):
    if v == 0.0:
        return 0
    m, e = math.frexp(float(v))
    return min(127 + (e - 1 if m == 0.5 else e), 0xFE)


def quantize(x, fmt, gran, pow2, given):
    table = value_table(fmt)
    fp8_max = FORMATS[fmt]["max"]
    rows, cols = x.shape
    tr, tc = (rows, cols) if gran == "tensor" else TILES[gran]
    n_tr, n_tc = -(-rows // tr), -(-cols // tc)
    scales, codes = [], np.zeros((rows, cols), dtype=np.uint8)
    for a in range(n_tr):
        for b in range(n_tc):
            tile = x[a * tr:(a + 1) * tr, b * tc:(b + 1) * tc]
            amax = float(np.max(np.abs(tile)))
            if gran == "mx1x32":
                code = e8m0(np.float32(amax) * np.float32(1.0 / fp8_max))
                scales.append(code)
                scale = np.float32(math.ldexp(1.0, 127 - code))
            else:
                scale = np.float32(given) if given is not None else scale_from_amax(amax, fp8_max, pow2)
                scales.append(float(np.float32(1.0) / scale))
            for i in range(tile.shape[0]):
                for j in range(tile.shape[1]):
                    codes[a * tr + i, b * tc + j] = encode(np.float32(tile[i, j]) * scale, fmt, table)
    return scales, codes


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    return "%016x" % h


def compute():
    x = fixture_matrix()
    cases = []
    for fmt, gran, pow2, given in CASES:
        scales, codes = quantize(x, fmt, gran, pow2, given)
        flat = codes.tobytes()
        cases.append({"format": fmt, "granularity": gran, "pow2": pow2, "scale": given, "scale_inv": scales,
                      "codes_fnv1a64": fnv1a64(flat), "codes_head": flat[:64].hex()})
    return {"rows": ROWS, "cols": COLS, "cases": cases}


if __name__ == "__main__":
    json.dump(compute(), sys.stdout, indent=1)
    sys.stdout.write("\n")
