"""The BLAKE2s tree level as a Triton kernel (device_digest.py says what it computes and why).

One program hashes BLOCK nodes, one per thread: up to 16 blocks of 64 bytes each, the state in registers.
Written out round by round (the message words in RFC 7693's SIGMA order for each of the ten rounds) so that
it compiles on any Triton that runs our candidates: no tuples indexed at trace time. The judge checks it
against hashlib before trusting it (device_digest.self_check), and the tests do on the CPU interpreter.
"""

import triton
import triton.language as tl


@triton.jit
def _rotr(x, n: tl.constexpr):
    return (x >> n) | (x << (32 - n))


@triton.jit
def _g(a, b, c, d, x, y):
    a = a + b + x
    d = _rotr(d ^ a, 16)
    c = c + d
    b = _rotr(b ^ c, 12)
    a = a + b + y
    d = _rotr(d ^ a, 8)
    c = c + d
    b = _rotr(b ^ c, 7)
    return a, b, c, d


@triton.jit
def _round(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
           s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15):
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, s0, s1)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, s2, s3)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, s4, s5)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, s6, s7)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, s8, s9)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, s10, s11)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, s12, s13)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, s14, s15)
    return v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15


@triton.jit
def _compress(h0, h1, h2, h3, h4, h5, h6, h7, i0, i1, i2, i3, i4, i5, i6, i7, t0, f0, f1,
              m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15):
    v0, v1, v2, v3, v4, v5, v6, v7 = h0, h1, h2, h3, h4, h5, h6, h7
    v8, v9, v10, v11, v12, v13, v14, v15 = i0, i1, i2, i3, i4 ^ t0, i5, i6 ^ f0, i7 ^ f1
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15)
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m14, m10, m4, m8, m9, m15, m13, m6, m1, m12, m0, m2, m11, m7, m5, m3)
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m11, m8, m12, m0, m5, m2, m15, m13, m10, m14, m3, m6, m7, m1, m9, m4)
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m7, m9, m3, m1, m13, m12, m11, m14, m2, m6, m5, m10, m4, m0, m15, m8)
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m9, m0, m5, m7, m2, m4, m10, m15, m14, m1, m11, m12, m6, m8, m3, m13)
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m2, m12, m6, m10, m0, m11, m8, m3, m4, m13, m7, m5, m15, m14, m1, m9)
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m12, m5, m1, m15, m14, m13, m4, m10, m0, m7, m6, m3, m9, m2, m8, m11)
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m13, m11, m7, m14, m12, m1, m3, m9, m5, m0, m15, m4, m8, m6, m2, m10)
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m6, m15, m14, m9, m11, m3, m0, m8, m12, m2, m13, m7, m1, m4, m10, m5)
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _round(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
        m10, m2, m8, m4, m7, m6, m1, m5, m15, m11, m9, m14, m3, m12, m13, m0)
    return (h0 ^ v0 ^ v8, h1 ^ v1 ^ v9, h2 ^ v2 ^ v10, h3 ^ v3 ^ v11, h4 ^ v4 ^ v12, h5 ^ v5 ^ v13,
            h6 ^ v6 ^ v14, h7 ^ v7 ^ v15)


@triton.jit
def _word(src, at, ok):
    return tl.load(src + at, mask=ok, other=0).to(tl.uint32, bitcast=True)


@triton.jit
def _const(consts, i: tl.constexpr):
    return tl.load(consts + i).to(tl.uint32)  # a word below 2^32 held in an int64


@triton.jit
def level(src, dst, consts, BLOCK: tl.constexpr):
    """One tree level: node g = (segment, index in it) of n_seg x cap. consts (int64): the IV (8 words), the
    parameter block XOR the IV for this depth (8), the IV's last word (chunked segments XOR their index,
    counted from chunk_base), then n_seg, cap, src_stride, full_bytes, last_bytes, depth, chunked and
    chunk_base. Sizes come through memory, not as arguments: Triton compiles a variant for each pattern of
    integer arguments (equal to 1, divisible by 16), seconds each for this kernel (370 s for the self-check's
    variants on the H200); pointers only vary by their alignment, which the caller keeps at 16 bytes."""
    n_seg = tl.load(consts + 17)
    cap = tl.load(consts + 18)
    src_stride = tl.load(consts + 19)
    full_bytes = tl.load(consts + 20)
    last_bytes = tl.load(consts + 21)
    depth = tl.load(consts + 22)
    chunked = tl.load(consts + 23)
    chunk_base = tl.load(consts + 24)
    g = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    seg = g // cap
    local = g % cap
    seg_bytes = tl.where(seg == n_seg - 1, last_bytes, full_bytes)
    n_nodes = tl.maximum((seg_bytes + 1023) // 1024, 1)
    active = (g < n_seg * cap) & (local < n_nodes)
    length = tl.minimum(tl.maximum(seg_bytes - local * 1024, 0), 1024)
    last = local == n_nodes - 1
    base = seg * src_stride + local * 256  # in words
    zero = tl.zeros([BLOCK], dtype=tl.uint32)
    ones = ~zero
    i0 = _const(consts, 0)
    i1 = _const(consts, 1)
    i2 = _const(consts, 2)
    i3 = _const(consts, 3)
    i4 = _const(consts, 4)
    i5 = _const(consts, 5)
    i6 = _const(consts, 6)
    i7 = _const(consts, 7)
    h0 = zero ^ _const(consts, 8)
    h1 = zero ^ _const(consts, 9)
    h3 = zero ^ _const(consts, 11)
    h4 = zero ^ _const(consts, 12)
    h5 = zero ^ _const(consts, 13)
    h6 = zero ^ _const(consts, 14)
    h2 = local.to(tl.uint32) ^ _const(consts, 10)  # the node offset
    h7 = tl.where((local * 0 + chunked) != 0, (seg + chunk_base).to(tl.uint32) ^ _const(consts, 16),
                  zero ^ _const(consts, 15))
    n_blocks = tl.maximum((length + 63) // 64, 1)
    for b in range(16):
        on = active & (b < n_blocks)
        final = b == n_blocks - 1
        t0 = tl.minimum(length, (b + 1) * 64).to(tl.uint32)
        f0 = tl.where(final, ones, zero)
        f1 = tl.where(final & last, ones, zero)
        at = base + b * 16
        lim = length - b * 64  # bytes of this block that are the node's
        n0, n1, n2, n3, n4, n5, n6, n7 = _compress(
            h0, h1, h2, h3, h4, h5, h6, h7, i0, i1, i2, i3, i4, i5, i6, i7, t0, f0, f1,
            _word(src, at + 0, on & (lim > 0)), _word(src, at + 1, on & (lim > 4)),
            _word(src, at + 2, on & (lim > 8)), _word(src, at + 3, on & (lim > 12)),
            _word(src, at + 4, on & (lim > 16)), _word(src, at + 5, on & (lim > 20)),
            _word(src, at + 6, on & (lim > 24)), _word(src, at + 7, on & (lim > 28)),
            _word(src, at + 8, on & (lim > 32)), _word(src, at + 9, on & (lim > 36)),
            _word(src, at + 10, on & (lim > 40)), _word(src, at + 11, on & (lim > 44)),
            _word(src, at + 12, on & (lim > 48)), _word(src, at + 13, on & (lim > 52)),
            _word(src, at + 14, on & (lim > 56)), _word(src, at + 15, on & (lim > 60)))
        h0 = tl.where(on, n0, h0)
        h1 = tl.where(on, n1, h1)
        h2 = tl.where(on, n2, h2)
        h3 = tl.where(on, n3, h3)
        h4 = tl.where(on, n4, h4)
        h5 = tl.where(on, n5, h5)
        h6 = tl.where(on, n6, h6)
        h7 = tl.where(on, n7, h7)
    # A segment already down to one digest passes it on: its root was the first level with a single node.
    keep = active & (seg_bytes == 32) & ((local * 0 + depth) > 0)
    out = dst + g * 8
    tl.store(out + 0, tl.where(keep, _word(src, base + 0, keep), h0).to(tl.int32, bitcast=True), mask=active)
    tl.store(out + 1, tl.where(keep, _word(src, base + 1, keep), h1).to(tl.int32, bitcast=True), mask=active)
    tl.store(out + 2, tl.where(keep, _word(src, base + 2, keep), h2).to(tl.int32, bitcast=True), mask=active)
    tl.store(out + 3, tl.where(keep, _word(src, base + 3, keep), h3).to(tl.int32, bitcast=True), mask=active)
    tl.store(out + 4, tl.where(keep, _word(src, base + 4, keep), h4).to(tl.int32, bitcast=True), mask=active)
    tl.store(out + 5, tl.where(keep, _word(src, base + 5, keep), h5).to(tl.int32, bitcast=True), mask=active)
    tl.store(out + 6, tl.where(keep, _word(src, base + 6, keep), h6).to(tl.int32, bitcast=True), mask=active)
    tl.store(out + 7, tl.where(keep, _word(src, base + 7, keep), h7).to(tl.int32, bitcast=True), mask=active)
