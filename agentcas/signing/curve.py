"""Ed25519 public-key checks that the signature library does not make.

A 32-byte Ed25519 public key encodes a point (y, sign of x) of the twisted Edwards
curve -x^2 + y^2 = 1 + d x^2 y^2 over GF(2^255 - 19). We decode it as RFC 8032 §5.1.3
does, but strictly: y must be below p (canonical), x must exist, and x = 0 with the
sign bit set is refused. A point of small order (the 8 points P with 8·P = identity,
among them the identity itself) lets anyone forge signatures that many verifiers
accept, so such keys are refused twice: by comparing the encoding with the known list
(canonical and non-canonical spellings, as libsodium does) and by computing 8·P. Keys
with a small-order component (L·P not the identity) are refused too: no honest key
generator makes one.
Plain Python integers suffice: three point doublings cost microseconds.
"""

from __future__ import annotations

P = 2**255 - 19
D = (-121665 * pow(121666, P - 2, P)) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)

# y-coordinates (little-endian, sign bit clear) of the small-order points, including the
# non-canonical spellings p-1+... that some decoders accept: y = 0, 1, p-1, the two
# order-8 y values, p (= 0) and p+1 (= 1). Each is listed with both sign bits.
_SMALL_ORDER_Y = (
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0100000000000000000000000000000000000000000000000000000000000000",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
)
SMALL_ORDER_ENCODINGS = frozenset(
    bytes.fromhex(y)[:31] + bytes([bytes.fromhex(y)[31] | sign]) for y in _SMALL_ORDER_Y
    for sign in (0x00, 0x80))


class BadPoint(ValueError):
    """Bytes that are not an acceptable Ed25519 public key."""


def decode_point(encoded: bytes) -> tuple[int, int]:
    """The affine point (x, y) a 32-byte key encodes; BadPoint if it is not strict RFC 8032."""
    if not isinstance(encoded, (bytes, bytearray)) or len(encoded) != 32:
        raise BadPoint("an Ed25519 public key is exactly 32 bytes")
    value = int.from_bytes(encoded, "little")
    sign, y = value >> 255, value & ((1 << 255) - 1)
    if y >= P:
        raise BadPoint("public key is not canonically encoded (y >= p)")
    x2 = (y * y - 1) * pow(D * y * y + 1, P - 2, P) % P
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P:
        raise BadPoint("public key is not a point on the Ed25519 curve")
    if x == 0 and sign:
        raise BadPoint("public key is not canonically encoded (x = 0 with the sign bit set)")
    if x & 1 != sign:
        x = P - x
    return x, y


def _add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    (x1, y1), (x2, y2) = a, b
    t = D * x1 * x2 * y1 * y2 % P
    x3 = (x1 * y2 + y1 * x2) * pow(1 + t, P - 2, P) % P
    y3 = (y1 * y2 + x1 * x2) * pow(1 - t, P - 2, P) % P
    return x3, y3


def has_small_order(encoded: bytes) -> bool:
    """True if the key is one of the small-order points (listed, or 8·P is the identity)."""
    if bytes(encoded) in SMALL_ORDER_ENCODINGS:
        return True
    point = decode_point(encoded)
    for _ in range(3):
        point = _add(point, point)
    return point == (0, 1)


def check_public_key(encoded: bytes) -> None:
    """Raise BadPoint unless `encoded` is a strict, canonical, full-order Ed25519 key."""
    if isinstance(encoded, (bytes, bytearray)) and bytes(encoded) in SMALL_ORDER_ENCODINGS:
        raise BadPoint("public key is a small-order point (it would verify forged signatures)")
    decode_point(encoded)
    if has_small_order(encoded):
        raise BadPoint("public key is a small-order point (it would verify forged signatures)")
    if not in_prime_subgroup(encoded):
        raise BadPoint("public key has a small-order component (not in the prime-order subgroup)")


L = 2**252 + 27742317777372353535851937790883648493  # order of the prime-order subgroup


def _add_extended(a, b):
    """Point addition in extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, xy = T/Z."""
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    pa = (y1 - x1) * (y2 - x2) % P
    pb = (y1 + x1) * (y2 + x2) % P
    pc = 2 * D * t1 * t2 % P
    pd = 2 * z1 * z2 % P
    e, f, g, h = pb - pa, pd - pc, pd + pc, pb + pa
    return e * f % P, g * h % P, f * g % P, e * h % P


def in_prime_subgroup(encoded: bytes) -> bool:
    """True if L·P is the identity: honest keys always are; mixed-order keys are not."""
    x, y = decode_point(encoded)
    point, result, scalar = (x, y, 1, x * y % P), (0, 1, 1, 0), L
    while scalar:
        if scalar & 1:
            result = _add_extended(result, point)
        point = _add_extended(point, point)
        scalar >>= 1
    return result[0] % P == 0 and (result[1] - result[2]) % P == 0
