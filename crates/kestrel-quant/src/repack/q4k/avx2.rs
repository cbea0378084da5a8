use super::*;
use crate::dot::x86::bytes_from_bits_32;
use std::arch::x86_64::*;

/// As `avx512::tiles`: the group (Q5_K's with `FIFTH`) against every activation row, the
/// first `gemm_upto` in the GEMM order, the rest in the GEMV order (Q5_K's four-token tiles
/// spill a little; two-token tiles were 22% slower all the same).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tiles<const FIFTH: bool>(
    nb: usize,
    w: &[u8],
    acts: &[&[u8]],
    gemm_upto: usize,
    out: &mut [f32],
) {
    let t_len = acts.len();
    // The weight stream is prefetched for a few tokens (decode), as on AVX-512; a matmul
    // over more passes over the group while it is in L1 / L2.
    let ahead = if t_len <= FEW_TOKENS {
        crate::cpu::weight_prefetch_ahead()
    } else {
        0
    };
    let mut c = 0;
    while c < t_len {
        let n = (t_len - c).min(4);
        let g = gemm_upto.saturating_sub(c).min(n);
        let (a, o) = (&acts[c..c + n], &mut out[c * R..(c + n) * R]);
        match (n, g) {
            (4, 4) => tile::<4, 4, FIFTH>(nb, w, ahead, a, o),
            (4, 0) => tile::<4, 0, FIFTH>(nb, w, ahead, a, o),
            (3, 0) => tile::<3, 0, FIFTH>(nb, w, ahead, a, o),
            (2, 0) => tile::<2, 0, FIFTH>(nb, w, ahead, a, o),
            (1, 0) => tile::<1, 0, FIFTH>(nb, w, ahead, a, o),
            _ => {
                for t in 0..n {
                    let o = &mut o[t * R..(t + 1) * R];
                    if t < g {
                        tile::<1, 1, FIFTH>(nb, w, ahead, &a[t..], o);
                    } else {
                        tile::<1, 0, FIFTH>(nb, w, ahead, &a[t..], o);
                    }
                }
            }
        }
        c += n;
    }
}

/// The group against `N` activation rows: `out[t * 16 + r]`, the first `G` tokens in the
/// GEMM order. Up to two tokens, both halves (rows `8 h ..`) go through each super-block
/// while it is in L1 (decode reads each weight line once); more, each half goes through
/// all super-blocks in turn (the accumulators of both would not fit the 16 registers; the
/// group stays in L1 or L2 for the second).
#[inline(always)]
unsafe fn tile<const N: usize, const G: usize, const FIFTH: bool>(
    nb: usize,
    w: &[u8],
    ahead: usize,
    acts: &[&[u8]],
    out: &mut [f32],
) {
    let passes: &[&[usize]] = if N <= 2 { &[&[0, 1]] } else { &[&[0], &[1]] };
    for &halves in passes {
        let mut acc = [[_mm256_setzero_ps(); N]; 2];
        let mut acc_min = [[_mm256_setzero_ps(); N]; 2];
        let gbb = block_bytes(FIFTH);
        for i in 0..nb {
            let wb = w.as_ptr().add(i * gbb);
            if halves[0] == 0 {
                crate::cpu::prefetch_ahead(wb, ahead, gbb);
            }
            for &h in halves {
                block::<N, G, FIFTH>(i, wb, h, acts, &mut acc[h], &mut acc_min[h]);
            }
        }
        for &h in halves {
            for c in 0..N {
                _mm256_storeu_ps(
                    out.as_mut_ptr().add(c * R + 8 * h),
                    _mm256_sub_ps(acc[h][c], acc_min[h][c]),
                );
            }
        }
    }
}

/// The low eight bytes of `v` (one a row) widened to i16, each twice: row r's at lanes 2r
/// and 2r + 1, as `madd` pairs them.
#[inline(always)]
unsafe fn pairs(v: __m128i) -> __m256i {
    let x = _mm_cvtepu8_epi16(v);
    _mm256_set_m128i(_mm_unpackhi_epi16(x, x), _mm_unpacklo_epi16(x, x))
}

/// Super-block `i` of rows `8 h .. 8 h + 8` against `N` activation rows, into `acc` and
/// `acc_min` (GEMM order for the first `G`, else GEMV, as `avx512::block`). Q5_K's levels
/// (`FIFTH`, up to 31) would overflow the i16 sums of eight steps (8 x 2 x 31 x 128): its
/// sub-blocks go through the scales' `madd` every four.
#[inline(always)]
unsafe fn block<const N: usize, const G: usize, const FIFTH: bool>(
    i: usize,
    wb: *const u8,
    h: usize,
    acts: &[&[u8]],
    acc: &mut [__m256; N],
    acc_min: &mut [__m256; N],
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let d = _mm256_cvtph_ps(_mm_loadu_si128(wb.add(D_OFF + 16 * h) as *const __m128i));
    let dmin = _mm256_cvtph_ps(_mm_loadu_si128(wb.add(DMIN_OFF + 16 * h) as *const __m128i));
    let a: [*const u8; N] = std::array::from_fn(|c| acts[c].as_ptr().add(i * Q8K_BYTES));
    let yd = |c: usize| _mm256_set1_ps((a[c] as *const f32).read_unaligned());
    let mut isum = [_mm256_setzero_si256(); N];
    let mut imin = [_mm256_setzero_si256(); N];
    for sb in 0..4 {
        // this half's rows: bytes 8 h .. 8 h + 8 of each of the group's scale vectors
        let half = |v: __m128i| if h == 0 { v } else { _mm_unpackhi_epi64(v, v) };
        let [sc0, sc1, mn0, mn1] = super::avx512::scales_pair(wb, sb).map(half);
        let (sc0, sc1) = (pairs(sc0), pairs(sc1));
        // each row's (m_j0, m_j1) as an i16 pair, against the token's (bsum_j0, bsum_j1)
        let (m0, m1) = (_mm_cvtepu8_epi16(mn0), _mm_cvtepu8_epi16(mn1));
        let mins = _mm256_set_m128i(_mm_unpackhi_epi16(m0, m1), _mm_unpacklo_epi16(m0, m1));
        let mut lo = [_mm256_setzero_si256(); N];
        let mut hi = [_mm256_setzero_si256(); N];
        // Q5_K: the first four steps' scaled sums.
        let mut part = [_mm256_setzero_si256(); N];
        for k in 0..8 {
            let at = wb.add(qs_at(FIFTH, sb, k) + 32 * h);
            let q = _mm256_loadu_si256(at as *const __m256i);
            let mut ql = _mm256_and_si256(q, m4);
            let mut qh = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            if FIFTH {
                // This half's 32 bits of each mask, one a byte, 16 where set.
                let bits = wb.add(qh_at(sb, k) + 4 * h);
                let sixteen = _mm256_set1_epi8(16);
                let fifth = |p: *const u8| _mm256_and_si256(bytes_from_bits_32(p), sixteen);
                ql = _mm256_or_si256(ql, fifth(bits));
                qh = _mm256_or_si256(qh, fifth(bits.add(8)));
            }
            for c in 0..N {
                let y = a[c].add(4 + 64 * sb + 4 * k);
                let yl = _mm256_set1_epi32((y as *const i32).read_unaligned());
                let yh = _mm256_set1_epi32((y.add(32) as *const i32).read_unaligned());
                lo[c] = _mm256_add_epi16(lo[c], _mm256_maddubs_epi16(ql, yl));
                hi[c] = _mm256_add_epi16(hi[c], _mm256_maddubs_epi16(qh, yh));
            }
            if FIFTH && k == 3 {
                for c in 0..N {
                    part[c] = _mm256_add_epi32(
                        _mm256_madd_epi16(lo[c], sc0),
                        _mm256_madd_epi16(hi[c], sc1),
                    );
                    (lo[c], hi[c]) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                }
            }
        }
        for c in 0..N {
            let isb =
                _mm256_add_epi32(_mm256_madd_epi16(lo[c], sc0), _mm256_madd_epi16(hi[c], sc1));
            let isb = if FIFTH {
                _mm256_add_epi32(isb, part[c])
            } else {
                isb
            };
            let bs = a[c].add(260 + 8 * sb) as *const i16;
            let b0 = bs.read_unaligned() as i32 + bs.add(1).read_unaligned() as i32;
            let b1 = bs.add(2).read_unaligned() as i32 + bs.add(3).read_unaligned() as i32;
            let bsums = _mm256_set1_epi32((b0 & 0xffff) | b1 << 16);
            let imb = _mm256_madd_epi16(mins, bsums);
            if c < G {
                let (dyd, dmyd) = (_mm256_mul_ps(d, yd(c)), _mm256_mul_ps(dmin, yd(c)));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isb), dyd, acc[c]);
                acc_min[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imb), dmyd, acc_min[c]);
            } else {
                isum[c] = _mm256_add_epi32(isum[c], isb);
                imin[c] = _mm256_add_epi32(imin[c], imb);
            }
        }
    }
    for c in G..N {
        let (dyd, dmyd) = (_mm256_mul_ps(d, yd(c)), _mm256_mul_ps(dmin, yd(c)));
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), dyd, acc[c]);
        acc_min[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin[c]), dmyd, acc_min[c]);
    }
}
