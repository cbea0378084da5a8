//! glibc's `expf` (the build its x86-64 ifunc picks on CPUs with FMA, `__expf_fma`), eight or
//! sixteen lanes at a time.
//!
//! llama.cpp's one-query flash attention calls libm's `expf` once per (position, head): two
//! calls' worth of latency per cached token and head at depth. This computes the same function
//! with the same operations (glibc 2.28+'s algorithm: `x·32/ln2 = k + r` by a shift-rounding
//! fused multiply-add, `2^(k/32)` from a 32-entry table, a cubic in `r`, all in f64, then one
//! rounding to f32), so its results are libm's bit for bit. Lanes with `|x| >= 88` (overflow,
//! underflow, infinities, NaN) are handed to libm itself.
//!
//! Whether this process's libm really is that function is checked once at run time against
//! `f32::exp` ([`matches_libm`]); callers fall back to libm when it is not (another libc, a CPU
//! without FMA where glibc picks its SSE2 build, ...).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `0x1.71547652b82fep+0 * 32`: 32/ln2.
const INV_LN2_N: f64 = f64::from_bits(0x4047_1547_652b_82fe);
/// `0x1.8p+52`: adding it rounds to an integer and leaves the integer in the low mantissa bits.
const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// The cubic's coefficients, scaled for `r` in units of 1/32.
const C0: f64 = f64::from_bits(0x3ebc_6af8_4b91_2394);
const C1: f64 = f64::from_bits(0x3f2e_bfce_50fa_c4f3);
const C2: f64 = f64::from_bits(0x3f96_2e42_ff0c_52d6);
/// `bits(2^(i/32)) - (i << 47)`: adding `k << 47` gives the bits of `2^(k/32)`.
const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// Whether `x` takes glibc's special-case path (`|x| >= 88`, infinities, NaN).
#[inline(always)]
fn out_of_range(x: f32) -> bool {
    (x.to_bits() >> 20) & 0x7ff >= 0x42b
}

/// One lane of the same computation (libm itself outside the main range).
pub fn expf_lane(x: f32) -> f32 {
    if out_of_range(x) {
        return x.exp();
    }
    let xd = x as f64;
    let kds = INV_LN2_N.mul_add(xd, SHIFT);
    let ki = kds.to_bits();
    let kd = kds - SHIFT;
    let r = INV_LN2_N.mul_add(xd, -kd);
    let s = f64::from_bits(TABLE[(ki & 31) as usize].wrapping_add(ki << 47));
    let z = C0.mul_add(r, C1);
    let r2 = r * r;
    let y = z.mul_add(r2, C2.mul_add(r, 1.0));
    (y * s) as f32
}

/// 16 lanes of libm's `expf`.
///
/// # Safety
/// The CPU has AVX-512 F and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn expf16(x: __m512) -> __m512 {
    let xd = _mm512_castps_pd(x);
    let lo = exp8(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    let hi = exp8(_mm512_cvtps_pd(_mm256_castpd_ps(
        _mm512_extractf64x4_pd::<1>(xd),
    )));
    let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
        _mm256_castps_pd(hi),
    ));
    // glibc's special cases: |x| >= 88 (top 12 bits of the magnitude >= 0x42b).
    let top = _mm512_and_si512(
        _mm512_srli_epi32::<20>(_mm512_castps_si512(x)),
        _mm512_set1_epi32(0x7ff),
    );
    let special = _mm512_cmpge_epi32_mask(top, _mm512_set1_epi32(0x42b));
    if special == 0 {
        return y;
    }
    let mut lanes = [0f32; 16];
    let mut xs = [0f32; 16];
    _mm512_storeu_ps(lanes.as_mut_ptr(), y);
    _mm512_storeu_ps(xs.as_mut_ptr(), x);
    for (i, (l, x)) in lanes.iter_mut().zip(xs).enumerate() {
        if special & (1 << i) != 0 {
            *l = x.exp();
        }
    }
    _mm512_loadu_ps(lanes.as_ptr())
}

/// The main path on 8 f64 lanes, rounded to f32.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn exp8(xd: __m512d) -> __m256 {
    let kds = _mm512_fmadd_pd(xd, _mm512_set1_pd(INV_LN2_N), _mm512_set1_pd(SHIFT));
    let ki = _mm512_castpd_si512(kds);
    let kd = _mm512_sub_pd(kds, _mm512_set1_pd(SHIFT));
    let r = _mm512_fmsub_pd(xd, _mm512_set1_pd(INV_LN2_N), kd);
    // TABLE[ki % 32]: two 16-entry lookups, picked by bit 4.
    let t = |i: usize| _mm512_loadu_si512(TABLE.as_ptr().add(i) as *const _);
    let low = _mm512_permutex2var_epi64(t(0), ki, t(8));
    let high = _mm512_permutex2var_epi64(t(16), ki, t(24));
    let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
    let tab = _mm512_mask_blend_epi64(upper, low, high);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(tab, _mm512_slli_epi64::<47>(ki)));
    let z = _mm512_fmadd_pd(r, _mm512_set1_pd(C0), _mm512_set1_pd(C1));
    let r2 = _mm512_mul_pd(r, r);
    let y = _mm512_fmadd_pd(r, _mm512_set1_pd(C2), _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(z, r2, y);
    _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
}

/// Values the run-time check compares with libm: a sweep over the main range, its edges, and
/// the special cases.
fn probe_values() -> Vec<f32> {
    let mut xs: Vec<f32> = (0..8192)
        .map(|i| -104.0 + i as f32 * (192.0 / 8192.0) + (i % 13) as f32 * 1e-4)
        .collect();
    // Small magnitudes, where rounding of r matters most, and ties of the 1/32 grid.
    xs.extend((0..2048).map(|i| (i as f32 - 1024.0) * 1e-5));
    xs.extend((0..1024).map(|i| (i as f32 - 512.0) * std::f32::consts::LN_2 / 32.0));
    xs.extend([
        0.0,
        -0.0,
        87.9,
        88.0,
        88.72,
        89.0,
        -87.9,
        -88.0,
        -103.3,
        -104.0,
        -105.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
    ]);
    xs.resize(xs.len().next_multiple_of(16), 0.5);
    xs
}

/// Whether [`expf16`] runs here and equals this process's libm `expf` bit for bit (checked
/// once, on a few thousand values).
pub fn matches_libm() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static MATCHES: OnceLock<bool> = OnceLock::new();
        *MATCHES.get_or_init(|| {
            if !crate::vexp::has_avx512() {
                return false;
            }
            probe_values().chunks_exact(16).all(|c| {
                let mut got = [0f32; 16];
                // SAFETY: AVX-512 F and FMA are available (checked above).
                unsafe { _mm512_storeu_ps(got.as_mut_ptr(), expf16(_mm512_loadu_ps(c.as_ptr()))) };
                got.iter().zip(c).all(|(g, x)| same(*g, x.exp()))
            })
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Bitwise equality, any NaN equal to any NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane form is glibc's algorithm; where the process's libm is glibc's FMA build it
    /// must agree everywhere (elsewhere it stays within an ulp or so).
    #[test]
    fn lane_form_is_libm_expf() {
        let exact = matches_libm();
        let mut seed = 0x2545F4914F6CDD1Du64;
        let xs = probe_values().into_iter().chain((0..200_000).map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Uniform bit patterns of negative floats down to about -128, then some positives.
            let bits = 0x8000_0000 | (seed as u32 % 0x4300_0000);
            let x = f32::from_bits(bits);
            if seed & 1 == 0 {
                x
            } else {
                -x * 0.6
            }
        }));
        for x in xs {
            let (got, want) = (expf_lane(x), x.exp());
            if exact {
                assert!(same(got, want), "expf({x:e}): {got:e} vs libm {want:e}");
            } else if want.is_finite() && want > 1e-37 {
                assert!(((got - want) / want).abs() < 1e-6, "expf({x:e})");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_form_equals_the_lane_form() {
        if !crate::vexp::has_avx512() {
            return;
        }
        let xs = probe_values();
        for c in xs.chunks_exact(16) {
            let mut got = [0f32; 16];
            // SAFETY: checked above.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), expf16(_mm512_loadu_ps(c.as_ptr()))) };
            for (g, &x) in got.iter().zip(c) {
                assert!(same(*g, expf_lane(x)), "x = {x:e}");
            }
        }
    }

    /// Every f32 (about a minute in release): `cargo test --release -p kestrel-models
    /// libm_exp -- --ignored`.
    #[test]
    #[ignore]
    fn lane_form_is_libm_expf_on_every_float() {
        if !matches_libm() {
            return;
        }
        let bad = (0..=u32::MAX)
            .map(f32::from_bits)
            .filter(|&x| !same(expf_lane(x), x.exp()))
            .take(5)
            .collect::<Vec<_>>();
        assert!(bad.is_empty(), "differ from libm at {bad:?}");
    }
}
