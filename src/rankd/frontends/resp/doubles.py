"""Doubles as Redis 7.2 writes them in replies: ``d2string`` (src/util.c).

Redis 7.0 wrote ``%.17g`` (``50 - 0.1`` is ``49.899999999999999``); 7.2
writes the digits of fpconv's Grisu2 (``49.9``), integral values within
``±(LLONG_MAX / 2)`` as integers, ``-0``, ``inf``, ``-inf`` and ``nan``.

rankd's reply encoders compile Redis 7.2.4's own fpconv (vendored in
``rankd/engine/fpconv``, called through ``rankd/engine/_doubles.h``); this
module is their pure-Python twin, a line-by-line port of that C code with
its 64-bit arithmetic (Grisu2 is not always the shortest representation:
porting it, rather than using ``repr``'s shortest digits, keeps those rare
cases Redis's too).  ``tests/test_resp_doubles.py`` holds the two to each
other over many doubles and to outputs of Redis 7.2.
"""

from __future__ import annotations

import math
import struct

_MASK = (1 << 64) - 1
_FRACMASK = 0x000FFFFFFFFFFFFF
_EXPMASK = 0x7FF0000000000000
_HIDDENBIT = 0x0010000000000000
_SIGNMASK = 0x8000000000000000
_EXPBIAS = 1023 + 52
_FIRSTPOWER = -348
_STEPPOWERS = 8
_NPOWERS = 87
_EXPMIN, _EXPMAX = -60, -32
#: ``double2ll``'s range: (double)(LLONG_MAX / 2), which rounds to 2**62.
_LL_HALF = float((2**63 - 1) // 2)
_TENS = [10**i for i in range(19, -1, -1)]  # fpconv's ``tens``: 10^19 .. 1


#: fpconv_powers.h's ``powers_ten``: 10^k for k = -348, -340, ... 340, as a
#: 64-bit fraction and a binary exponent (copied: a few are not rounded to
#: nearest, and Grisu2's digits depend on them).
_POWERS = [
    (18054884314459144840, -1220), (13451937075301367670, -1193), (10022474136428063862, -1166),
    (14934650266808366570, -1140), (11127181549972568877, -1113), (16580792590934885855, -1087),
    (12353653155963782858, -1060), (18408377700990114895, -1034), (13715310171984221708, -1007),
    (10218702384817765436, -980), (15227053142812498563, -954), (11345038669416679861, -927),
    (16905424996341287883, -901), (12595523146049147757, -874), (9384396036005875287, -847),
    (13983839803942852151, -821), (10418772551374772303, -794), (15525180923007089351, -768),
    (11567161174868858868, -741), (17236413322193710309, -715), (12842128665889583758, -688),
    (9568131466127621947, -661), (14257626930069360058, -635), (10622759856335341974, -608),
    (15829145694278690180, -582), (11793632577567316726, -555), (17573882009934360870, -529),
    (13093562431584567480, -502), (9755464219737475723, -475), (14536774485912137811, -449),
    (10830740992659433045, -422), (16139061738043178685, -396), (12024538023802026127, -369),
    (17917957937422433684, -343), (13349918974505688015, -316), (9946464728195732843, -289),
    (14821387422376473014, -263), (11042794154864902060, -236), (16455045573212060422, -210),
    (12259964326927110867, -183), (18268770466636286478, -157), (13611294676837538539, -130),
    (10141204801825835212, -103), (15111572745182864684, -77), (11258999068426240000, -50),
    (16777216000000000000, -24), (12500000000000000000, 3), (9313225746154785156, 30),
    (13877787807814456755, 56), (10339757656912845936, 83), (15407439555097886824, 109),
    (11479437019748901445, 136), (17105694144590052135, 162), (12744735289059618216, 189),
    (9495567745759798747, 216), (14149498560666738074, 242), (10542197943230523224, 269),
    (15709099088952724970, 295), (11704190886730495818, 322), (17440603504673385349, 348),
    (12994262207056124023, 375), (9681479787123295682, 402), (14426529090290212157, 428),
    (10748601772107342003, 455), (16016664761464807395, 481), (11933345169920330789, 508),
    (17782069995880619868, 534), (13248674568444952270, 561), (9871031767461413346, 588),
    (14708983551653345445, 614), (10959046745042015199, 641), (16330252207878254650, 667),
    (12166986024289022870, 694), (18130221999122236476, 720), (13508068024458167312, 747),
    (10064294952495520794, 774), (14996968138956309548, 800), (11173611982879273257, 827),
    (16649979327439178909, 853), (12405201291620119593, 880), (9242595204427927429, 907),
    (13772540099066387757, 933), (10261342003245940623, 960), (15290591125556738113, 986),
    (11392378155556871081, 1013), (16975966327722178521, 1039), (12648080533535911531, 1066),
]


def _multiply(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """fpconv's ``multiply``: the high 64 bits of the product, rounded up."""
    (af, ae), (bf, be) = a, b
    lomask = 0xFFFFFFFF
    ah_bl = (af >> 32) * (bf & lomask)
    al_bh = (af & lomask) * (bf >> 32)
    al_bl = (af & lomask) * (bf & lomask)
    ah_bh = (af >> 32) * (bf >> 32)
    tmp = (ah_bl & lomask) + (al_bh & lomask) + (al_bl >> 32)
    tmp += 1 << 31
    return (ah_bh + (ah_bl >> 32) + (al_bh >> 32) + (tmp >> 32)) & _MASK, ae + be + 64


def _grisu2(value: float) -> tuple[list[int], int]:
    """The digits of ``value`` (> 0) and their decimal exponent K."""
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    frac, exp = bits & _FRACMASK, (bits & _EXPMASK) >> 52
    if exp:
        frac += _HIDDENBIT
        exp -= _EXPBIAS
    else:
        exp = -_EXPBIAS + 1
    # get_normalized_boundaries
    upper_frac, upper_exp = (frac << 1) + 1, exp - 1
    while upper_frac & (_HIDDENBIT << 1) == 0:
        upper_frac <<= 1
        upper_exp -= 1
    upper_frac = (upper_frac << (64 - 52 - 2)) & _MASK
    upper_exp -= 64 - 52 - 2
    l_shift = 2 if frac == _HIDDENBIT else 1
    lower_frac, lower_exp = (frac << l_shift) - 1, exp - l_shift
    lower_frac = (lower_frac << (lower_exp - upper_exp)) & _MASK
    # normalize
    while frac & _HIDDENBIT == 0:
        frac <<= 1
        exp -= 1
    frac, exp = (frac << 11) & _MASK, exp - 11
    # find_cachedpow10 (C's truncating conversions)
    approx = int(-(upper_exp + _NPOWERS) * 0.30102999566398114)
    index = int((approx - _FIRSTPOWER) / _STEPPOWERS)
    while True:
        current = upper_exp + _POWERS[index][1] + 64
        if current < _EXPMIN:
            index += 1
        elif current > _EXPMAX:
            index -= 1
        else:
            break
    k = _FIRSTPOWER + index * _STEPPOWERS
    power = _POWERS[index]
    w = _multiply((frac, exp), power)
    upper = _multiply((upper_frac, upper_exp), power)
    lower = _multiply((lower_frac, upper_exp), power)
    return _generate_digits(w, (upper[0] - 1, upper[1]), lower[0] + 1, -k)


def _round_digit(digits: list[int], delta: int, rem: int, kappa: int, frac: int) -> None:
    while (rem < frac and delta - rem >= kappa
           and (rem + kappa < frac or frac - rem > rem + kappa - frac)):
        digits[-1] -= 1
        rem += kappa


def _generate_digits(w: tuple[int, int], upper: tuple[int, int], lower_frac: int,
                     big_k: int) -> tuple[list[int], int]:
    wfrac = (upper[0] - w[0]) & _MASK
    delta = (upper[0] - lower_frac) & _MASK
    shift = -upper[1]
    one = 1 << shift
    part1, part2 = upper[0] >> shift, upper[0] & (one - 1)
    digits: list[int] = []
    kappa = 10
    position = 10  # tens + 10: 10^9
    while kappa > 0:
        div = _TENS[position]
        digit = part1 // div
        if digit or digits:
            digits.append(digit)
        part1 -= digit * div
        kappa -= 1
        tmp = ((part1 << shift) + part2) & _MASK
        if tmp <= delta:
            _round_digit(digits, delta, tmp, (div << shift) & _MASK, wfrac)
            return digits, big_k + kappa
        position += 1
    unit = 18  # tens + 18: 10
    while True:
        part2 = (part2 * 10) & _MASK
        delta = (delta * 10) & _MASK
        kappa -= 1
        digit = part2 >> shift
        if digit or digits:
            digits.append(digit)
        part2 &= one - 1
        if part2 < delta:
            _round_digit(digits, delta, part2, one, (wfrac * _TENS[unit]) & _MASK)
            return digits, big_k + kappa
        unit -= 1


def _emit_digits(digits: list[int], big_k: int, negative: bool) -> str:
    """fpconv's ``emit_digits``."""
    text = "".join(map(str, digits))
    ndigits = len(digits)
    exp = abs(big_k + ndigits - 1)
    if big_k >= 0 and exp < ndigits + 7:
        return text + "0" * big_k
    if big_k < 0 and (big_k > -7 or exp < 4):
        offset = ndigits + big_k
        if offset <= 0:
            return "0." + "0" * -offset + text
        return text[:offset] + "." + text[offset:]
    ndigits = min(ndigits, 18 - negative)
    mantissa = text[0] + ("." + text[1:ndigits] if ndigits > 1 else "")
    sign = "-" if big_k + ndigits - 1 < 0 else "+"
    return f"{mantissa}e{sign}{exp}"


def format_double(value: float) -> bytes:
    """``value`` as Redis 7.2's ``d2string`` writes it."""
    if math.isnan(value):
        return b"nan"
    if math.isinf(value):
        return b"-inf" if value < 0 else b"inf"
    if value == 0:
        return b"-0" if math.copysign(1.0, value) < 0 else b"0"
    if -_LL_HALF <= value <= _LL_HALF and value == int(value):
        return b"%d" % int(value)
    negative = value < 0
    digits, big_k = _grisu2(-value if negative else value)
    return (("-" if negative else "") + _emit_digits(digits, big_k, negative)).encode()
