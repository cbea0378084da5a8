//! The AVX2/F16C kernel of the f16-cache attention (prefill's one-query-per-task path).

use super::{Rows, Span};
use std::arch::x86_64::*;

/// Largest group x head_dim handled with stack scratch (e.g. 8 heads of 128).
const MAX_GROUP_DIM: usize = 2048;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16x8(p: *const half::f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(x: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// exp of 8 lanes (Cephes' single-precision polynomial, ~1 ulp; inputs clamped to +-88.38).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-88.376_26)),
        _mm256_set1_ps(88.376_26),
    );
    let n = _mm256_floor_ps(_mm256_fmadd_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        5e-1,
    ] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    y = _mm256_fmadd_ps(
        y,
        _mm256_mul_ps(r, r),
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    let pow2n = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n))
}

/// Positions per block of the blocked kernel.
const BLOCK: usize = 16;

/// SIMD twin of `attend_group_f16_scalar`: the same math, taken 16 positions at a time.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn attend_group_f16(qg: &[f32], rows: &Rows, span: &Span, scale: f32, out: &mut [f32]) {
    let d = rows.head_dim;
    let g = qg.len() / d;
    if qg.len() > MAX_GROUP_DIM || g > 64 || d > 256 {
        return super::attend_group_f16_scalar(qg, rows, span, scale, out);
    }
    let vecs = d / 8;
    let mut q16 = [0f32; MAX_GROUP_DIM];
    for (dst, src) in q16.iter_mut().zip(qg) {
        *dst = super::round_f16(*src);
    }
    let mut acc = [0f32; MAX_GROUP_DIM];
    let mut max = [f32::NEG_INFINITY; 64];
    let mut sum = [0f32; 64];
    // scores, then probabilities: [head][position in block]
    let mut p = [0f32; 64 * BLOCK];
    let mut row = [0f32; 256];
    span.for_each_run(|base, n| {
        let mut j0 = 0;
        while j0 < n {
            let nb = BLOCK.min(n - j0);
            // scores q·k for every head of the group and every position of the block
            for jj in 0..nb {
                let kp = rows.k(base + j0 + jj).as_ptr();
                for j in 0..vecs {
                    _mm256_storeu_ps(row.as_mut_ptr().add(8 * j), load_f16x8(kp.add(8 * j)));
                }
                for h in 0..g {
                    let qh = q16.as_ptr().add(h * d);
                    let mut dot = _mm256_setzero_ps();
                    for j in 0..vecs {
                        dot = _mm256_fmadd_ps(
                            _mm256_loadu_ps(qh.add(8 * j)),
                            _mm256_loadu_ps(row.as_ptr().add(8 * j)),
                            dot,
                        );
                    }
                    p[h * BLOCK + jj] = hsum(dot) * scale;
                }
            }
            // one rescale per head per block, then the block's probabilities
            for h in 0..g {
                let ps = &mut p[h * BLOCK..h * BLOCK + BLOCK];
                let block_max = ps[..nb].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let m = max[h].max(block_max);
                if m > max[h] {
                    let c = (max[h] - m).exp();
                    let cv = _mm256_set1_ps(c);
                    let a = acc.as_mut_ptr().add(h * d);
                    for j in 0..vecs {
                        _mm256_storeu_ps(
                            a.add(8 * j),
                            _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(
                                _mm256_mul_ps(_mm256_loadu_ps(a.add(8 * j)), cv),
                            )),
                        );
                    }
                    sum[h] *= c;
                    max[h] = m;
                }
                let mv = _mm256_set1_ps(m);
                for half in 0..BLOCK / 8 {
                    let x = _mm256_sub_ps(_mm256_loadu_ps(ps.as_ptr().add(8 * half)), mv);
                    _mm256_storeu_ps(ps.as_mut_ptr().add(8 * half), exp8(x));
                }
                sum[h] += ps[..nb].iter().sum::<f32>();
            }
            // acc += p · V, each V row converted once for the group
            for jj in 0..nb {
                let vp = rows.v(base + j0 + jj).as_ptr();
                for j in 0..vecs {
                    _mm256_storeu_ps(row.as_mut_ptr().add(8 * j), load_f16x8(vp.add(8 * j)));
                }
                for h in 0..g {
                    let w = _mm256_set1_ps(p[h * BLOCK + jj]);
                    let a = acc.as_mut_ptr().add(h * d);
                    for j in 0..vecs {
                        let x = _mm256_fmadd_ps(
                            _mm256_loadu_ps(row.as_ptr().add(8 * j)),
                            w,
                            _mm256_loadu_ps(a.add(8 * j)),
                        );
                        // The accumulator keeps f16 precision, as ggml's does.
                        _mm256_storeu_ps(
                            a.add(8 * j),
                            _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)),
                        );
                    }
                }
            }
            j0 += nb;
        }
    });
    for h in 0..g {
        for i in 0..d {
            out[h * d + i] = acc[h * d + i] / sum[h];
        }
    }
}
