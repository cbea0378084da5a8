//! ggml's vectorized `exp` and SiLU as its AVX-512 build computes them (`ggml_v_expf`,
//! `ggml_v_silu`, `ggml_vec_swiglu_f32`): a degree-5 polynomial after a Cody-Waite reduction,
//! `scalef` by the integer part. llama.cpp's MLP and prompt attention go through these, so
//! matching its activations bit for bit needs this function, not a correctly rounded `exp`.
//! The 16-lane SIMD form runs where AVX-512 is available; elsewhere the same operations run
//! lane by lane (fused multiply-adds via `mul_add`, exact), so results agree on every CPU.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

const SHIFT: f32 = f32::from_bits(0x4b40_0000); // 0x1.8p23
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b); // 0x1.715476p+0
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0x1.62e4p-1
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e); // 0x1.7f7d1cp-20
const C5: f32 = f32::from_bits(0x3c07_2010); // 0x1.0e4020p-7
const C4: f32 = f32::from_bits(0x3d2b_9f17); // 0x1.573e2ep-5
const C3: f32 = f32::from_bits(0x3e2a_af33); // 0x1.555e66p-3
const C2: f32 = f32::from_bits(0x3eff_fedb); // 0x1.fffdb6p-2
const C1: f32 = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1

/// One lane of `ggml_v_expf`.
#[inline(always)]
pub fn expf_lane(x: f32) -> f32 {
    let z = x.mul_add(LOG2E, SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    let j = C5
        .mul_add(b, C4)
        .mul_add(u, C3.mul_add(b, C2))
        .mul_add(u, C1.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // scalef: j * 2^n with one rounding (exact in f64, then rounded to f32).
    (j as f64 * 2f64.powi(n as i32)) as f32
}

/// `ggml_v_expf` on 16 lanes.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn expf16(x: __m512) -> __m512 {
    let r = _mm512_set1_ps(SHIFT);
    let z = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(
        n,
        _mm512_set1_ps(LN2_LO),
        _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x),
    );
    let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_set1_ps(C5), b, _mm512_set1_ps(C4)),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(C3), b, _mm512_set1_ps(C2)),
        ),
        u,
        _mm512_fmadd_ps(_mm512_set1_ps(C1), b, _mm512_set1_ps(1.0)),
    );
    let res = _mm512_scalef_ps(j, n);
    if d == 0 {
        return res;
    }
    let le0 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
    // Where n <= 0 the result underflows to 0, else it overflows to infinity.
    let alt = _mm512_mask_blend_ps(le0, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
    _mm512_mask_blend_ps(d, res, alt)
}

/// `ggml_v_expf` on 8 lanes, bit for bit [`expf_lane`] (so [`expf16`] too): `scalef` is a
/// multiply by `2^n` built from its exponent bits, exact while `2^n` and the result stay normal
/// (`-126 <= n <= 127`); a vector with a lane outside that range goes lane by lane.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn expf8(x: __m256) -> __m256 {
    let r = _mm256_set1_ps(SHIFT);
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(LN2_LO),
        _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x),
    );
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_set1_ps(C5), b, _mm256_set1_ps(C4)),
            u,
            _mm256_fmadd_ps(_mm256_set1_ps(C3), b, _mm256_set1_ps(C2)),
        ),
        u,
        _mm256_fmadd_ps(_mm256_set1_ps(C1), b, _mm256_set1_ps(1.0)),
    );
    // j is within [0.7, 1.5], so j * 2^n is normal for -125 <= n <= 127; NaN fails both tests.
    let low = _mm256_cmp_ps::<_CMP_GE_OQ>(n, _mm256_set1_ps(-125.0));
    let high = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_set1_ps(127.0));
    if _mm256_movemask_ps(_mm256_and_ps(low, high)) != 0xff {
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), x);
        for v in lanes.iter_mut() {
            *v = expf_lane(*v);
        }
        return _mm256_loadu_ps(lanes.as_ptr());
    }
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(j, _mm256_castsi256_ps(bits))
}

/// Whether the 16-lane form runs here (and [`kestrel_quant::cpu::isa_cap`] allows it).
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            kestrel_quant::cpu::isa_cap() >= kestrel_quant::Backend::Avx512Vnni
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the 8-lane forms run here: AVX2, FMA and F16C (and the cap allows them).
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            kestrel_quant::cpu::isa_cap() >= kestrel_quant::Backend::Avx2
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `gate[i] = silu(gate[i]) * up[i]` over one row, as `ggml_vec_swiglu_f32`: 16-lane blocks
/// with `x / (1 + expf16(-x))`, the last `len % 16` with libm's `expf`.
pub fn swiglu_row(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let body = n - n % 16;
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512 F and FMA are available.
        unsafe { swiglu_avx512(&mut gate[..body], &up[..body]) };
    } else if has_avx2() {
        // SAFETY: AVX2 and FMA are available.
        unsafe { swiglu_avx2(&mut gate[..body], &up[..body]) };
    } else {
        swiglu_lanes(&mut gate[..body], &up[..body]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    swiglu_lanes(&mut gate[..body], &up[..body]);
    for (g, u) in gate[body..n].iter_mut().zip(&up[body..n]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

fn swiglu_lanes(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + expf_lane(0.0 - *g)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn swiglu_avx512(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.chunks_exact_mut(16).zip(up.chunks_exact(16)) {
        let x = _mm512_loadu_ps(g.as_ptr());
        let e = expf16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        let silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
        _mm512_storeu_ps(
            g.as_mut_ptr(),
            _mm512_mul_ps(silu, _mm512_loadu_ps(u.as_ptr())),
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.chunks_exact_mut(8).zip(up.chunks_exact(8)) {
        let x = _mm256_loadu_ps(g.as_ptr());
        let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(
            g.as_mut_ptr(),
            _mm256_mul_ps(silu, _mm256_loadu_ps(u.as_ptr())),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_equal_the_simd_form_and_stay_near_exp() {
        let xs: Vec<f32> = (0..4096)
            .map(|i| (i as f32 - 2048.0) * 0.05 + (i % 7) as f32 * 1e-3)
            .chain([-200.0, -104.0, -87.5, 0.0, -0.0, 88.0, 89.0, 200.0])
            .chain([f32::NEG_INFINITY, -1e30, 1e30, f32::INFINITY])
            .chain([0.5; 4])
            .collect();
        assert_eq!(
            xs.len() % 16,
            0,
            "every value goes through the SIMD form too"
        );
        assert_eq!(expf_lane(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf_lane(-200.0), 0.0);
        assert_eq!(expf_lane(200.0), f32::INFINITY);
        for &x in &xs {
            let e = expf_lane(x);
            let want = (x as f64).exp();
            if want > 1e-30 && want < 1e30 {
                assert!(
                    ((e as f64 - want) / want).abs() < 1e-6,
                    "exp({x}) = {e}, want {want}"
                );
            }
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            for c in xs.chunks_exact(8) {
                let mut got = [0f32; 8];
                // SAFETY: checked above.
                unsafe { _mm256_storeu_ps(got.as_mut_ptr(), expf8(_mm256_loadu_ps(c.as_ptr()))) };
                for (g, &x) in got.iter().zip(c) {
                    assert_eq!(g.to_bits(), expf_lane(x).to_bits(), "x = {x} (8 lanes)");
                }
            }
        } else {
            eprintln!("skipped the 8-lane exp: this CPU lacks AVX2/FMA/F16C");
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx512() {
            for c in xs.chunks_exact(16) {
                let mut got = [0f32; 16];
                // SAFETY: checked above.
                unsafe { _mm512_storeu_ps(got.as_mut_ptr(), expf16(_mm512_loadu_ps(c.as_ptr()))) };
                for (g, &x) in got.iter().zip(c) {
                    assert_eq!(g.to_bits(), expf_lane(x).to_bits(), "x = {x}");
                }
            }
        }
    }
}
