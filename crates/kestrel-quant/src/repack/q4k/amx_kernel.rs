use super::*;
use crate::amx::{release, TileConfig};
use std::arch::asm;
use std::arch::x86_64::*;

/// Bytes of one super-block's B tiles: `[pair][B1, B2, Bm][16 x 64]`.
pub(super) const QUANT_BYTES: usize = 4 * 3 * 1024;

/// One super-block's tile sums, `[pair][C1, C2, Cm]`, each up to 16 tokens x 16 rows.
#[repr(C, align(64))]
struct Sums([[i32; 256]; 12]);

/// The group's B tiles for all `nb` super-blocks into `bq`. A B tile row `k` holds, for
/// each of the 16 rows, the 4 elements `4k .. 4k + 4` of the pair (rows 0..8: sub-block
/// j0, the low nibbles; rows 8..16: j1, the high ones), which is the layout's `qs` order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn build_b(nb: usize, w: &[u8], bq: &mut [u8]) {
    let m4 = _mm512_set1_epi8(0x0f);
    let low_bytes = _mm512_set1_epi16(0x00ff);
    // A row's u8 scale in all four bytes of its 32-bit lane.
    let spread =
        |v: __m128i| _mm512_mullo_epi32(_mm512_cvtepu8_epi32(v), _mm512_set1_epi32(0x0101_0101));
    // Bytes times per-lane factors (each product below 256).
    let mul_bytes = |q: __m512i, f: __m512i| {
        let lo = _mm512_mullo_epi16(
            _mm512_and_si512(q, low_bytes),
            _mm512_and_si512(f, low_bytes),
        );
        let hi = _mm512_mullo_epi16(_mm512_srli_epi16::<8>(q), _mm512_srli_epi16::<8>(f));
        _mm512_or_si512(lo, _mm512_slli_epi16::<8>(hi))
    };
    for i in 0..nb {
        let wb = w.as_ptr().add(i * GROUP_BLOCK_BYTES);
        for sb in 0..4 {
            let [s0, s1, mn0, mn1] = avx512::scales_pair(wb, sb);
            let (s0, s1) = (spread(s0), spread(s1));
            let lo4 = |s: __m512i| _mm512_and_si512(s, m4);
            let hi2 = |s: __m512i| _mm512_and_si512(_mm512_srli_epi16::<4>(s), m4);
            let dst = bq.as_mut_ptr().add(i * QUANT_BYTES + sb * 3 * 1024);
            let (m0, m1) = (spread(mn0), spread(mn1));
            for k in 0..8 {
                let q = _mm512_loadu_si512(wb.add(QS_OFF + (sb * 8 + k) * R * 4) as *const _);
                let (ql, qh) = (
                    _mm512_and_si512(q, m4),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4),
                );
                let row = |tile: usize, half: usize| {
                    dst.add(tile * 1024 + (half * 8 + k) * 64) as *mut __m512i
                };
                _mm512_storeu_si512(row(0, 0), mul_bytes(ql, lo4(s0)));
                _mm512_storeu_si512(row(0, 1), mul_bytes(qh, lo4(s1)));
                _mm512_storeu_si512(row(1, 0), mul_bytes(ql, hi2(s0)));
                _mm512_storeu_si512(row(1, 1), mul_bytes(qh, hi2(s1)));
                _mm512_storeu_si512(row(2, 0), m0);
                _mm512_storeu_si512(row(2, 1), m1);
            }
        }
    }
}

/// Super-block `i`, pair `sb` of the token tile whose panel part starts at `a_tile`: its
/// three tile products into `sums.0[3 sb ..]`.
#[inline(always)]
unsafe fn pair_products(a_tile: *const u8, bq: *const u8, i: usize, sb: usize, sums: &mut Sums) {
    let a = a_tile.add((i * 4 + sb) * 1024);
    let b = bq.add(i * QUANT_BYTES + sb * 3 * 1024);
    let c = sums.0[3 * sb].as_mut_ptr();
    asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tileloadd tmm3, [{a} + {s64} * 1]",
        "tileloadd tmm4, [{b} + {s64} * 1]",
        "tileloadd tmm5, [{b} + {s64} * 1 + 1024]",
        "tileloadd tmm6, [{b} + {s64} * 1 + 2048]",
        "tdpbsud tmm0, tmm3, tmm4",
        "tdpbsud tmm1, tmm3, tmm5",
        "tdpbsud tmm2, tmm3, tmm6",
        "tilestored [{c} + {s64} * 1], tmm0",
        "tilestored [{c} + {s64} * 1 + 1024], tmm1",
        "tilestored [{c} + {s64} * 1 + 2048], tmm2",
        a = in(reg) a, b = in(reg) b, c = in(reg) c, s64 = in(reg) 64usize,
        options(nostack),
    );
}

/// Rows `16 g .. 16 g + 16` (`w`, the group) against the activation rows `acts` (their
/// quants also in `panel`, [`AmxPanel`]): `out[t * 16 + r]`, in the GEMM order for
/// `t < gemm_upto` and the GEMV order after, bit for bit as [`dot_scalar`]. `bq`: scratch
/// of `nb * QUANT_BYTES`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
pub(super) unsafe fn group(
    nb: usize,
    w: &[u8],
    acts: &[&[u8]],
    panel: &AmxPanel,
    gemm_upto: usize,
    out: &mut [f32],
    bq: &mut [u8],
) {
    let t_len = acts.len();
    debug_assert!(panel.fits(t_len, nb));
    build_b(nb, w, bq);
    let mut sums = Sums([[0; 256]; 12]);
    let mut loaded = 0;
    let mut t0 = 0;
    while t0 < t_len {
        let n = (t_len - t0).min(16);
        if n != loaded {
            // C tiles 0..3: n tokens x 16 rows i32; A tile 3: n tokens x 64 quants;
            // B tiles 4..7: 16 x (16 rows x 4 quants).
            let nr = n as u8;
            TileConfig::new(&[
                (nr, 64),
                (nr, 64),
                (nr, 64),
                (nr, 64),
                (16, 64),
                (16, 64),
                (16, 64),
            ])
            .load();
            loaded = n;
        }
        let a_tile = panel.tile(t0);
        let mut acc = [_mm512_setzero_ps(); 16];
        let mut acc_min = [_mm512_setzero_ps(); 16];
        for i in 0..nb {
            for sb in 0..4 {
                pair_products(a_tile, bq.as_ptr(), i, sb, &mut sums);
            }
            let wb = w.as_ptr().add(i * GROUP_BLOCK_BYTES);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(D_OFF) as *const __m256i));
            let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(DMIN_OFF) as *const __m256i));
            for t in 0..n {
                let y = acts[t0 + t].as_ptr().add(i * Q8K_BYTES);
                let yd = _mm512_set1_ps((y as *const f32).read_unaligned());
                let (dyd, dmyd) = (_mm512_mul_ps(d, yd), _mm512_mul_ps(dmin, yd));
                let gemm = t0 + t < gemm_upto;
                let (mut isum, mut imin) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for sb in 0..4 {
                    let at = |k: usize| {
                        _mm512_load_si512(sums.0[3 * sb + k][16 * t..].as_ptr() as *const _)
                    };
                    let isb = _mm512_add_epi32(at(0), _mm512_slli_epi32::<4>(at(1)));
                    let imb = at(2);
                    if gemm {
                        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isb), dyd, acc[t]);
                        acc_min[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imb), dmyd, acc_min[t]);
                    } else {
                        isum = _mm512_add_epi32(isum, isb);
                        imin = _mm512_add_epi32(imin, imb);
                    }
                }
                if !gemm {
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dyd, acc[t]);
                    acc_min[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), dmyd, acc_min[t]);
                }
            }
        }
        for t in 0..n {
            let o = out.as_mut_ptr().add((t0 + t) * R);
            _mm512_storeu_ps(o, _mm512_sub_ps(acc[t], acc_min[t]));
        }
        t0 += n;
    }
    release();
}
