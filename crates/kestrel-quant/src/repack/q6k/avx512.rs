// Per-token and per-lane register arrays are indexed by constant loop counters (unrolled).
#![allow(clippy::needless_range_loop)]

use super::*;
use crate::simd::dpwssd;
use std::arch::x86_64::*;

/// Quad `quad` of a super-block's quants (`qs`) as the levels of its chunks A, B, C, D.
#[inline(always)]
pub(super) unsafe fn quad_levels(qs: *const u8, quad: usize) -> [__m512i; 4] {
    let q = qs.add(quad * QUAD_BYTES);
    let z0 = _mm512_loadu_si512(q as *const _);
    let z1 = _mm512_loadu_si512(q.add(64) as *const _);
    let z2 = _mm512_loadu_si512(q.add(128) as *const _);
    let (m63, m30, m4) = (
        _mm512_set1_epi8(0x3f),
        _mm512_set1_epi8(0x30),
        _mm512_set1_epi8(0x0f),
    );
    // (x & m4) | y, where y holds only bits 4, 5.
    let join = |x, y| _mm512_ternarylogic_epi32::<0xEC>(x, y, m4);
    [
        _mm512_and_si512(z0, m63),
        _mm512_and_si512(z1, m63),
        join(z2, _mm512_and_si512(_mm512_srli_epi16::<2>(z0), m30)),
        join(
            _mm512_srli_epi16::<4>(z2),
            _mm512_and_si512(_mm512_srli_epi16::<2>(z1), m30),
        ),
    ]
}

/// Super-block `i` of a group: its quants, the 16 rows' `d` as f32, its scales.
#[inline(always)]
unsafe fn super_block(w: &[u8], i: usize) -> (*const u8, __m512, *const u8) {
    let (qs_at, meta) = offsets(i);
    let dp = w.as_ptr().add(meta);
    let d = _mm512_cvtph_ps(_mm256_loadu_si256(dp as *const __m256i));
    (w.as_ptr().add(qs_at), d, dp.add(D_BYTES))
}

/// One quad's four chunks into their lanes `s`: `s[k] += sc * (levels_k . y_k)` per row.
#[inline(always)]
unsafe fn quad_lanes(
    qs: *const u8,
    quad: usize,
    yq: *const i32,
    sc: __m512i,
    s: &mut [__m512i; 4],
) {
    let lv = quad_levels(qs, quad);
    for k in 0..4 {
        let yv = _mm512_set1_epi32(yq.add(k).read_unaligned());
        let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lv[k], yv);
        s[k] = dpwssd(s[k], dot, sc);
    }
}

/// Element group `p`'s scale pairs of the 16 rows: i32 lane r = `sc_2p | sc_2p+1 << 16`.
#[inline(always)]
unsafe fn scale_pairs(sc: *const u8, p: usize) -> __m512i {
    _mm512_cvtepi8_epi16(_mm256_loadu_si256(sc.add(32 * p) as *const __m256i))
}

/// The 16 rows' hsum_float_8 of their 8 lanes (`acc[l]`, one vector per lane).
#[inline(always)]
unsafe fn hsum8_rows(acc: &[__m512; 8]) -> __m512 {
    let a = _mm512_add_ps(acc[0], acc[4]);
    let b = _mm512_add_ps(acc[1], acc[5]);
    let c = _mm512_add_ps(acc[2], acc[6]);
    let d = _mm512_add_ps(acc[3], acc[7]);
    _mm512_add_ps(_mm512_add_ps(a, c), _mm512_add_ps(b, d))
}

/// 16 rows x `N` tokens in `ggml_vec_dot_q6_K_q8_K`'s order (8 lanes per row).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(super) unsafe fn lanes8<const N: usize>(nb: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let lo16 = _mm512_set1_epi32(0xffff);
    let neg32 = _mm512_set1_epi16(-32);
    let mut acc = [[_mm512_setzero_ps(); 8]; N];
    let ahead = crate::cpu::weight_prefetch_ahead();
    for i in 0..nb {
        crate::cpu::prefetch_ahead(
            w.as_ptr().wrapping_add(i * GROUP_BLOCK_BYTES),
            ahead,
            GROUP_BLOCK_BYTES,
        );
        let (qs, d, sp) = super_block(w, i);
        // Per element group p: the scales of its two halves (low 16 bits of each lane),
        // and the pair times -32 for the offset seed.
        let mut sc = [[_mm512_setzero_si512(); 2]; 8];
        let mut seed = [_mm512_setzero_si512(); 8];
        for p in 0..8 {
            let v = scale_pairs(sp, p);
            sc[p] = [_mm512_and_si512(v, lo16), _mm512_srli_epi32::<16>(v)];
            seed[p] = _mm512_mullo_epi16(v, neg32);
        }
        for c in 0..N {
            let y = acts[c].as_ptr().add(i * Q8K_BYTES);
            let dy = _mm512_mul_ps(d, _mm512_set1_ps((y as *const f32).read_unaligned()));
            let bsums = y.add(260) as *const i32;
            let seed_lane = |l: usize| {
                let b = _mm512_set1_epi32(bsums.add(l).read_unaligned());
                dpwssd(_mm512_setzero_si512(), seed[l], b)
            };
            // Lanes 0..4 (first halves of each 32) and 4..8, in separate arrays so every
            // index is a constant and the sums stay in registers.
            let mut lo: [__m512i; 4] = std::array::from_fn(seed_lane);
            let mut hi: [__m512i; 4] = std::array::from_fn(|l| seed_lane(4 + l));
            for eg in 0..8 {
                let yq = y.add(4 + 32 * eg) as *const i32;
                quad_lanes(qs, 2 * eg, yq, sc[eg][0], &mut lo);
                quad_lanes(qs, 2 * eg + 1, yq.add(4), sc[eg][1], &mut hi);
            }
            let s: [__m512i; 8] = std::array::from_fn(|l| if l < 4 { lo[l] } else { hi[l - 4] });
            for l in 0..8 {
                acc[c][l] = _mm512_fmadd_ps(dy, _mm512_cvtepi32_ps(s[l]), acc[c][l]);
            }
        }
    }
    for c in 0..N {
        _mm512_storeu_ps(out.as_mut_ptr().add(c * R), hsum8_rows(&acc[c]));
    }
}

/// 16 rows x `N` tokens in llama.cpp's tiled order (one integer sum per super-block).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(super) unsafe fn batched<const N: usize>(nb: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let neg32 = _mm512_set1_epi16(-32);
    let mut chain = [_mm512_setzero_ps(); N];
    for i in 0..nb {
        let (qs, d, sp) = super_block(w, i);
        let mut y = [std::ptr::null::<u8>(); N];
        let mut s = [_mm512_setzero_si512(); N];
        for p in 0..8 {
            let seed = _mm512_mullo_epi16(scale_pairs(sp, p), neg32);
            for c in 0..N {
                y[c] = acts[c].as_ptr().add(i * Q8K_BYTES);
                let b = (y[c].add(260) as *const i32).add(p).read_unaligned();
                s[c] = dpwssd(s[c], seed, _mm512_set1_epi32(b));
            }
        }
        for eg in 0..8 {
            let v = scale_pairs(sp, eg);
            // Sign-extended scales of the two halves.
            let sc = [
                _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(v)),
                _mm512_srai_epi32::<16>(v),
            ];
            for h in 0..2 {
                let lv = quad_levels(qs, 2 * eg + h);
                for c in 0..N {
                    let yq = y[c].add(4 + 32 * eg + 16 * h) as *const i32;
                    let mut dot = _mm512_setzero_si512();
                    for (k, q) in lv.iter().enumerate() {
                        let yv = _mm512_set1_epi32(yq.add(k).read_unaligned());
                        dot = _mm512_dpbusd_epi32(dot, *q, yv);
                    }
                    s[c] = _mm512_add_epi32(s[c], _mm512_mullo_epi32(dot, sc[h]));
                }
            }
        }
        for c in 0..N {
            let yd = _mm512_set1_ps((y[c] as *const f32).read_unaligned());
            let f = _mm512_mul_ps(_mm512_cvtepi32_ps(s[c]), d);
            chain[c] = _mm512_fmadd_ps(f, yd, chain[c]);
        }
    }
    for c in 0..N {
        _mm512_storeu_ps(out.as_mut_ptr().add(c * R), chain[c]);
    }
}
