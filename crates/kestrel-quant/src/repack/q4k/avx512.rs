use super::*;
use std::arch::x86_64::*;

/// Sub-block pair `sb`'s 6-bit scales and mins of the 16 rows (see the layout) as bytes:
/// `[sc_j0, sc_j1, m_j0, m_j1]` (16-bit shifts, masked).
#[inline(always)]
pub(super) unsafe fn scales_pair(wb: *const u8, sb: usize) -> [__m128i; 4] {
    let at = wb.add(SCM_OFF + 3 * R * sb);
    let s = _mm_loadu_si128(at as *const __m128i);
    let m = _mm_loadu_si128(at.add(R) as *const __m128i);
    let h = _mm_loadu_si128(at.add(2 * R) as *const __m128i);
    let (lo4, top) = (_mm_set1_epi8(0x0f), _mm_set1_epi8(0x30));
    let hi4 = |v: __m128i| _mm_and_si128(_mm_srli_epi16::<4>(v), lo4);
    [
        _mm_or_si128(
            _mm_and_si128(s, lo4),
            _mm_and_si128(_mm_slli_epi16::<4>(h), top),
        ),
        _mm_or_si128(hi4(s), _mm_and_si128(_mm_slli_epi16::<2>(h), top)),
        _mm_or_si128(_mm_and_si128(m, lo4), _mm_and_si128(h, top)),
        _mm_or_si128(hi4(m), _mm_and_si128(_mm_srli_epi16::<2>(h), top)),
    ]
}

/// A group's scales and mins for all `nb` super-blocks unpacked into `pre` (`nb * 256`
/// bytes: per super-block and pair, [`scales_pair`]'s four vectors), for matmuls over many
/// tokens, which would otherwise unpack them once per four tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
pub(super) unsafe fn unpack_scales(nb: usize, w: &[u8], gbb: usize, pre: &mut [u8]) {
    for i in 0..nb {
        let wb = w.as_ptr().add(i * gbb);
        for sb in 0..4 {
            let at = pre.as_mut_ptr().add((i * 4 + sb) * 64);
            for (v, x) in scales_pair(wb, sb).into_iter().enumerate() {
                _mm_storeu_si128(at.add(16 * v) as *mut __m128i, x);
            }
        }
    }
}

/// All of `acts` through [`tile`]s of 4 tokens (Q5_K's group with `FIFTH`) (wider ones spill: 8-token tiles made the
/// 1.5B's pp512 12% slower, AMD VM, 2 threads): the GEMM-order tokens
/// (`t < gemm_upto`) in whole tiles, a GEMV tail of up to 3 tokens joined to the last of
/// them (one pass over the group saved). Shapes without a tile of their own (a `gemm_upto`
/// that is not a multiple of 4) go one token at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
pub(super) unsafe fn tiles<const PRE: bool, const FIFTH: bool>(
    nb: usize,
    w: &[u8],
    pre: *const u8,
    acts: &[&[u8]],
    gemm_upto: usize,
    out: &mut [f32],
) {
    let t_len = acts.len();
    let mut c = 0;
    while c < t_len {
        let mut n = (t_len - c).min(4);
        let g = gemm_upto.saturating_sub(c).min(n);
        if g == n && t_len - c - n <= 3 && c + n >= gemm_upto {
            n = t_len - c;
        }
        let (a, o) = (&acts[c..c + n], &mut out[c * R..(c + n) * R]);
        match (n, g) {
            (1, 0) => tile::<1, 0, PRE, FIFTH>(nb, w, pre, a, o),
            (2, 0) => tile::<2, 0, PRE, FIFTH>(nb, w, pre, a, o),
            (3, 0) => tile::<3, 0, PRE, FIFTH>(nb, w, pre, a, o),
            (4, 4) => tile::<4, 4, PRE, FIFTH>(nb, w, pre, a, o),
            (5, 4) => tile::<5, 4, PRE, FIFTH>(nb, w, pre, a, o),
            (6, 4) => tile::<6, 4, PRE, FIFTH>(nb, w, pre, a, o),
            (7, 4) => tile::<7, 4, PRE, FIFTH>(nb, w, pre, a, o),
            _ => {
                for t in 0..n {
                    let o = &mut o[t * R..(t + 1) * R];
                    if t < g {
                        tile::<1, 1, PRE, FIFTH>(nb, w, pre, &a[t..], o);
                    } else {
                        tile::<1, 0, PRE, FIFTH>(nb, w, pre, &a[t..], o);
                    }
                }
            }
        }
        c += n;
    }
}

/// The group (`nb` super-blocks) against `N` activation rows (`acts[0..N]`): `out[t * 16 +
/// r]`, the first `G` tokens in the GEMM order, the rest in the GEMV order.
#[inline(always)]
unsafe fn tile<const N: usize, const G: usize, const PRE: bool, const FIFTH: bool>(
    nb: usize,
    w: &[u8],
    pre: *const u8,
    acts: &[&[u8]],
    out: &mut [f32],
) {
    let mut acc = [_mm512_setzero_ps(); N];
    let mut acc_min = [_mm512_setzero_ps(); N];
    let ahead = if PRE {
        0
    } else {
        crate::cpu::weight_prefetch_ahead()
    };
    let gbb = block_bytes(FIFTH);
    for i in 0..nb {
        let wb = w.as_ptr().add(i * gbb);
        crate::cpu::prefetch_ahead(wb, ahead, gbb);
        let pre = pre.wrapping_add(i * 256);
        block::<N, G, PRE, FIFTH>(i, wb, pre, acts, &mut acc, &mut acc_min);
    }
    for c in 0..N {
        _mm512_storeu_ps(
            out.as_mut_ptr().add(c * R),
            _mm512_sub_ps(acc[c], acc_min[c]),
        );
    }
}

/// Super-block `i` (`wb`, Q5_K's with `FIFTH`; with `PRE`, its scales unpacked at `pre`, [`unpack_scales`], else
/// taken from `wb`) against `N` activation rows (`acts[0..N]`): the first `G` in the GEMM
/// order, the rest in the GEMV order, into `acc` and `acc_min`. The order is a constant so
/// that only its accumulators are live: a few tokens run from registers.
#[inline(always)]
unsafe fn block<const N: usize, const G: usize, const PRE: bool, const FIFTH: bool>(
    i: usize,
    wb: *const u8,
    pre: *const u8,
    acts: &[&[u8]],
    acc: &mut [__m512; N],
    acc_min: &mut [__m512; N],
) {
    let m4 = _mm512_set1_epi8(0x0f);
    let d = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(D_OFF) as *const __m256i));
    let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(DMIN_OFF) as *const __m256i));
    let a: [*const u8; N] = std::array::from_fn(|c| acts[c].as_ptr().add(i * Q8K_BYTES));
    // d * y_d and dmin * y_d of token c are computed where used (registers are scarce).
    let yd = |c: usize| _mm512_set1_ps((a[c] as *const f32).read_unaligned());
    let mut isum = [_mm512_setzero_si512(); N];
    let mut imin = [_mm512_setzero_si512(); N];
    for sb in 0..4 {
        let [sc0, sc1, mn0, mn1] = if PRE {
            let at = pre.add(sb * 64);
            std::array::from_fn(|v| _mm_loadu_si128(at.add(16 * v) as *const __m128i))
        } else {
            scales_pair(wb, sb)
        };
        let (sc0, sc1) = (_mm512_cvtepu8_epi32(sc0), _mm512_cvtepu8_epi32(sc1));
        // Each row's (m_j0, m_j1) as an i16 pair: the mins term is one `vpdpwssd` against
        // the token's (bsum_j0, bsum_j1), the same integer as the two products.
        let mins = _mm512_or_si512(
            _mm512_cvtepu8_epi32(mn0),
            _mm512_slli_epi32::<16>(_mm512_cvtepu8_epi32(mn1)),
        );
        let mut lo = [_mm512_setzero_si512(); N];
        let mut hi = [_mm512_setzero_si512(); N];
        for k in 0..8 {
            let at = wb.add(qs_at(FIFTH, sb, k));
            let q = _mm512_loadu_si512(at as *const _);
            let mut ql = _mm512_and_si512(q, m4);
            let mut qh = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
            if FIFTH {
                // Q5_K: 16 added where the fifth bit is set (one mask bit a level).
                let bits = wb.add(qh_at(sb, k)) as *const u64;
                let sixteen = _mm512_set1_epi8(16);
                ql = _mm512_mask_add_epi8(ql, bits.read_unaligned(), ql, sixteen);
                qh = _mm512_mask_add_epi8(qh, bits.add(1).read_unaligned(), qh, sixteen);
            }
            for c in 0..N {
                let y = a[c].add(4 + 64 * sb + 4 * k);
                let yl = _mm512_set1_epi32((y as *const i32).read_unaligned());
                let yh = _mm512_set1_epi32((y.add(32) as *const i32).read_unaligned());
                lo[c] = _mm512_dpbusd_epi32(lo[c], ql, yl);
                hi[c] = _mm512_dpbusd_epi32(hi[c], qh, yh);
            }
        }
        for c in 0..N {
            let isb = _mm512_add_epi32(
                _mm512_mullo_epi32(lo[c], sc0),
                _mm512_mullo_epi32(hi[c], sc1),
            );
            let bs = a[c].add(260 + 8 * sb) as *const i16;
            let b0 = bs.read_unaligned() as i32 + bs.add(1).read_unaligned() as i32;
            let b1 = bs.add(2).read_unaligned() as i32 + bs.add(3).read_unaligned() as i32;
            // Each |bsum_j| <= 32 * 128 fits an i16.
            let bsums = _mm512_set1_epi32((b0 & 0xffff) | b1 << 16);
            if c < G {
                let imb = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mins, bsums);
                let (dyd, dmyd) = (_mm512_mul_ps(d, yd(c)), _mm512_mul_ps(dmin, yd(c)));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isb), dyd, acc[c]);
                acc_min[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imb), dmyd, acc_min[c]);
            } else {
                isum[c] = _mm512_add_epi32(isum[c], isb);
                imin[c] = _mm512_dpwssd_epi32(imin[c], mins, bsums);
            }
        }
    }
    for c in G..N {
        {
            let (dyd, dmyd) = (_mm512_mul_ps(d, yd(c)), _mm512_mul_ps(dmin, yd(c)));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), dyd, acc[c]);
            acc_min[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin[c]), dmyd, acc_min[c]);
        }
    }
}
