// Per-token and per-lane register arrays are indexed by constant loop counters (unrolled).
#![allow(clippy::needless_range_loop)]

//! The layout's kernels on AVX2 (no AVX-512): a 32-byte vector holds one 4-element chunk of 8
//! rows (half of the layout's 64-byte vector), so a group is two halves. A chunk's 4 products
//! per row come from `maddubs` (levels 0..63 against i8: pair sums within i16) and one `madd`
//! by the row's scale, which is `sc * (levels . y)` in i32: the integers of the AVX-512
//! kernels (`vpdpbusd`, then `vpdpwssd` by the scale), and their f32 steps, so the bits are the
//! same. Both halves of a group go through each super-block while it is in L1 (decode reads
//! each weight line once).

use super::*;
use std::arch::x86_64::*;

/// Quad `quad` of a super-block's quants (`qs`), rows `8 half ..`, as the levels of its chunks
/// A, B, C, D (as `avx512::quad_levels`).
#[inline(always)]
unsafe fn quad_levels(qs: *const u8, quad: usize, half: usize) -> [__m256i; 4] {
    let q = qs.add(quad * QUAD_BYTES + 32 * half);
    let z0 = _mm256_loadu_si256(q as *const __m256i);
    let z1 = _mm256_loadu_si256(q.add(64) as *const __m256i);
    let z2 = _mm256_loadu_si256(q.add(128) as *const __m256i);
    let (m63, m30, m4) = (
        _mm256_set1_epi8(0x3f),
        _mm256_set1_epi8(0x30),
        _mm256_set1_epi8(0x0f),
    );
    let hi2 = |z| _mm256_and_si256(_mm256_srli_epi16::<2>(z), m30);
    [
        _mm256_and_si256(z0, m63),
        _mm256_and_si256(z1, m63),
        _mm256_or_si256(_mm256_and_si256(z2, m4), hi2(z0)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(z2), m4), hi2(z1)),
    ]
}

/// Element group `p`'s scale pairs of rows `8 half ..`: i16 lanes `(sc_2p, sc_2p+1)` per row.
#[inline(always)]
unsafe fn scale_pairs(sc: *const u8, p: usize, half: usize) -> __m256i {
    _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.add(32 * p + 16 * half) as *const __m128i))
}

/// Per row, `levels . y` of one chunk as i16 pair sums (at most 2 * 63 * 128 < 2^15).
#[inline(always)]
unsafe fn chunk_pairs(levels: __m256i, yq: *const i32) -> __m256i {
    _mm256_maddubs_epi16(levels, _mm256_set1_epi32(yq.read_unaligned()))
}

/// The 8 rows' hsum_float_8 of their 8 lanes (as `avx512::hsum8_rows`).
#[inline(always)]
unsafe fn hsum8_rows(acc: &[__m256; 8]) -> __m256 {
    let a = _mm256_add_ps(acc[0], acc[4]);
    let b = _mm256_add_ps(acc[1], acc[5]);
    let c = _mm256_add_ps(acc[2], acc[6]);
    let d = _mm256_add_ps(acc[3], acc[7]);
    _mm256_add_ps(_mm256_add_ps(a, c), _mm256_add_ps(b, d))
}

/// 16 rows x `N` tokens in `ggml_vec_dot_q6_K_q8_K`'s order (as `avx512::lanes8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn lanes8<const N: usize>(nb: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let neg32 = _mm256_set1_epi16(-32);
    let mut acc = [[[_mm256_setzero_ps(); 8]; N]; 2];
    let ahead = crate::cpu::weight_prefetch_ahead();
    for i in 0..nb {
        crate::cpu::prefetch_ahead(
            w.as_ptr().wrapping_add(i * GROUP_BLOCK_BYTES),
            ahead,
            GROUP_BLOCK_BYTES,
        );
        let (qs_at, meta) = offsets(i);
        let (qs, dp) = (w.as_ptr().add(qs_at), w.as_ptr().add(meta));
        let sp = dp.add(D_BYTES);
        for half in 0..2 {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(dp.add(16 * half) as *const __m128i));
            // Per element group p: each half's scale in both i16 of a row's lane, and the
            // pair times -32 for the offset seed.
            let mut sc = [[_mm256_setzero_si256(); 2]; 8];
            let mut seed = [_mm256_setzero_si256(); 8];
            for p in 0..8 {
                let v = scale_pairs(sp, p, half);
                sc[p] = [
                    _mm256_blend_epi16::<0b1010_1010>(v, _mm256_slli_epi32::<16>(v)),
                    _mm256_blend_epi16::<0b1010_1010>(_mm256_srli_epi32::<16>(v), v),
                ];
                seed[p] = _mm256_mullo_epi16(v, neg32);
            }
            for c in 0..N {
                let y = acts[c].as_ptr().add(i * Q8K_BYTES);
                let dy = _mm256_mul_ps(d, _mm256_set1_ps((y as *const f32).read_unaligned()));
                let bsums = y.add(260) as *const i32;
                let mut s: [__m256i; 8] = std::array::from_fn(|l| {
                    _mm256_madd_epi16(seed[l], _mm256_set1_epi32(bsums.add(l).read_unaligned()))
                });
                for eg in 0..8 {
                    let yq = y.add(4 + 32 * eg) as *const i32;
                    for h in 0..2 {
                        let lv = quad_levels(qs, 2 * eg + h, half);
                        for k in 0..4 {
                            let pairs = chunk_pairs(lv[k], yq.add(4 * h + k));
                            let l = 4 * h + k;
                            s[l] = _mm256_add_epi32(s[l], _mm256_madd_epi16(pairs, sc[eg][h]));
                        }
                    }
                }
                for l in 0..8 {
                    acc[half][c][l] =
                        _mm256_fmadd_ps(dy, _mm256_cvtepi32_ps(s[l]), acc[half][c][l]);
                }
            }
        }
    }
    for half in 0..2 {
        for c in 0..N {
            _mm256_storeu_ps(
                out.as_mut_ptr().add(c * R + 8 * half),
                hsum8_rows(&acc[half][c]),
            );
        }
    }
}

/// 16 rows x `N` tokens in llama.cpp's tiled order (as `avx512::batched`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn batched<const N: usize>(nb: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let neg32 = _mm256_set1_epi16(-32);
    let ones = _mm256_set1_epi16(1);
    let mut chain = [[_mm256_setzero_ps(); N]; 2];
    for i in 0..nb {
        let (qs_at, meta) = offsets(i);
        let (qs, dp) = (w.as_ptr().add(qs_at), w.as_ptr().add(meta));
        let sp = dp.add(D_BYTES);
        let y: [*const u8; N] = std::array::from_fn(|c| acts[c].as_ptr().add(i * Q8K_BYTES));
        for half in 0..2 {
            let mut s = [_mm256_setzero_si256(); N];
            for p in 0..8 {
                let seed = _mm256_mullo_epi16(scale_pairs(sp, p, half), neg32);
                for c in 0..N {
                    let b = (y[c].add(260) as *const i32).add(p).read_unaligned();
                    s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(seed, _mm256_set1_epi32(b)));
                }
            }
            for eg in 0..8 {
                let v = scale_pairs(sp, eg, half);
                // Sign-extended scales of the two halves.
                let sc = [
                    _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(v)),
                    _mm256_srai_epi32::<16>(v),
                ];
                for h in 0..2 {
                    let lv = quad_levels(qs, 2 * eg + h, half);
                    for c in 0..N {
                        let yq = y[c].add(4 + 32 * eg + 16 * h) as *const i32;
                        // Two chunks' pair sums added in i16 (4 products: at most
                        // 4 * 63 * 128 < 2^15 in size), then to i32: the quad's dot per row.
                        let four = |k: usize| {
                            let a = chunk_pairs(lv[k], yq.add(k));
                            let b = chunk_pairs(lv[k + 1], yq.add(k + 1));
                            _mm256_madd_epi16(_mm256_add_epi16(a, b), ones)
                        };
                        let dot = _mm256_add_epi32(four(0), four(2));
                        s[c] = _mm256_add_epi32(s[c], _mm256_mullo_epi32(dot, sc[h]));
                    }
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(dp.add(16 * half) as *const __m128i));
            for c in 0..N {
                let yd = _mm256_set1_ps((y[c] as *const f32).read_unaligned());
                let f = _mm256_mul_ps(_mm256_cvtepi32_ps(s[c]), d);
                chain[half][c] = _mm256_fmadd_ps(f, yd, chain[half][c]);
            }
        }
    }
    for half in 0..2 {
        for c in 0..N {
            _mm256_storeu_ps(out.as_mut_ptr().add(c * R + 8 * half), chain[half][c]);
        }
    }
}
