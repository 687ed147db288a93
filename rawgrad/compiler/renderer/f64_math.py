"""Constants of the float64 routines the GPU renderers build from plain double arithmetic (exp2, log2,
sin, pow): PTX has no float64 transcendental instructions and LLVM aborts on their AMDGPU intrinsics, so
the PTX and AMDGPU renderers decompose them the same way, with these constants."""
from __future__ import annotations

# float64 layout (IEEE 754 binary64)
F64_MANTISSA_BITS = 52
F64_EXPONENT_BIAS = 1023
F64_EXPONENT_MASK = 0x7FF
F64_MIN_NORMAL = 2.0 ** -1022
SUBNORMAL_SCALE_BITS = 54  # scales any subnormal into the normal range
# exp2 arguments outside this range give 0 / inf anyway; clamping keeps the integer part representable
EXP2_F64_MIN_ARG, EXP2_F64_MAX_ARG = -1080.0, 1030.0
EXP_F64_TERMS = 15  # Taylor terms of e**t for |t| <= ln2/2: truncation error ~1e-20
ATANH_F64_TERMS = 12  # atanh series terms for |s| <= 0.172: truncation error ~1e-19
SIN_F64_TERMS = 9  # sine terms (and 10 cosine terms) for |r| <= pi/4: truncation error ~1e-19
# pi/2 as 33 + 33 significant bits + the rest: k * part is exact in the first two parts for |k| < 2**20
# (Cody-Waite reduction)
PIO2_F64_PARTS = (1.5707963267341256, 6.077100506303966e-11, 2.0222662487959506e-21)
