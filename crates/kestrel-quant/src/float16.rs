//! IEEE half (`ggml_half`) and bfloat16 as raw bits, converted by hand so that the rounding is
//! pinned down: f32 -> f16 rounds to nearest-even, exactly like F16C's `vcvtps2ph` (ggml's
//! `GGML_FP32_TO_FP16` on x86) and numpy's `astype(np.float16)`; f16 -> f32 is exact.

/// A `ggml_half`: IEEE binary16 bits, stored little-endian in blocks.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct F16(pub u16);

impl F16 {
    pub const ZERO: F16 = F16(0);

    #[inline]
    pub fn to_f32(self) -> f32 {
        f16_to_f32(self.0)
    }

    #[inline]
    pub fn from_f32(x: f32) -> Self {
        F16(f32_to_f16(x))
    }
}

/// Exact widening of binary16 bits to f32 (subnormals, infinities and NaN payloads included).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: shift the mantissa up until its leading bit is the implicit one.
            let mut e = 113u32; // 127 - 14
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 112) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// f32 to binary16 bits, round to nearest, ties to even; overflow gives infinity.
#[inline]
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 0xff {
        let nan = if man != 0 {
            0x200 | (man >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    let e = exp - 112; // rebias 127 -> 15
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // Subnormal result: value = r * 2^-24.
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    // A carry out of the mantissa bumps the exponent, up to infinity: that is the right answer.
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

/// bfloat16 bits to f32 (exact).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 to bfloat16 bits, as ggml's `ggml_compute_fp32_to_bf16`: NaN forced quiet, else
/// round to nearest even.
#[inline]
pub fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_finite_value() {
        for h in 0u16..=0xffff {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f32_to_f16(f) & 0x7fff > 0x7c00);
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "{h:#06x} -> {f}");
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1 and the next f16: ties go to the even (1.0).
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds up to infinity
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(f32::powi(2.0, -25)), 0); // tie to even zero
        assert_eq!(f32_to_f16(1.5 * f32::powi(2.0, -25)), 1);
    }
}
