use super::*;
use crate::amx::{release, TileConfig};
use std::arch::asm;
use std::arch::x86_64::*;

/// Bytes of one super-block's B tiles: `[chunk][lo, hi][16 x 64]`.
pub(super) const B_BYTES: usize = 4 * 2 * 1024;

/// A super-block's two i32 tiles (low and high parts), up to 16 tokens x 16 rows.
#[repr(C, align(64))]
struct Sums([[i32; 256]; 2]);

/// The group's B tiles for all `nb` super-blocks into `bq`. Quad q (16 elements, sub-block
/// q) gives B rows `4 (q % 4) ..` of chunk `q / 4`: its chunks A..D are 4 elements of each
/// of the 16 rows, the interleave a B tile row wants.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn build_b(nb: usize, w: &[u8], bq: &mut [u8]) {
    let low_bytes = _mm512_set1_epi16(0x00ff);
    let (m127, k32) = (_mm512_set1_epi16(127), _mm512_set1_epi16(32));
    for i in 0..nb {
        let (qs_at, meta) = offsets(i);
        let sp = w.as_ptr().add(meta + D_BYTES);
        for q in 0..16 {
            // Sub-block q's scale, sign-extended, in both 16-bit halves of each row's lane.
            let v =
                _mm512_cvtepi8_epi16(_mm256_loadu_si256(sp.add(32 * (q / 2)) as *const __m256i));
            let s = if q % 2 == 0 {
                _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(v))
            } else {
                _mm512_srai_epi32::<16>(v)
            };
            let s = _mm512_or_si512(
                _mm512_and_si512(s, _mm512_set1_epi32(0xffff)),
                _mm512_slli_epi32::<16>(s),
            );
            let lv = avx512::quad_levels(w.as_ptr().add(qs_at), q);
            let dst = bq
                .as_mut_ptr()
                .add(i * B_BYTES + (q / 4) * 2048 + (q % 4) * 256);
            for (c, l) in lv.iter().enumerate() {
                // Even and odd bytes as i16, minus 32, times the scale.
                let ve =
                    _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_and_si512(*l, low_bytes), k32), s);
                let vo = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_srli_epi16::<8>(*l), k32), s);
                let lo = _mm512_or_si512(
                    _mm512_and_si512(ve, m127),
                    _mm512_slli_epi16::<8>(_mm512_and_si512(vo, m127)),
                );
                let hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srai_epi16::<7>(ve), low_bytes),
                    _mm512_slli_epi16::<8>(_mm512_srai_epi16::<7>(vo)),
                );
                _mm512_storeu_si512(dst.add(c * 64) as *mut _, lo);
                _mm512_storeu_si512(dst.add(1024 + c * 64) as *mut _, hi);
            }
        }
    }
}

/// Rows `16 g .. 16 g + 16` (`w`, the group) against the activation rows `acts` (their
/// quants also in `panel`): `out[t * 16 + r]` in the tiled order, bit for bit as
/// [`dot_scalar`]. `bq`: scratch of `nb * B_BYTES`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(super) unsafe fn group(
    nb: usize,
    w: &[u8],
    acts: &[&[u8]],
    panel: &AmxPanel,
    out: &mut [f32],
    bq: &mut [u8],
) {
    let t_len = acts.len();
    debug_assert!(panel.fits(t_len, nb));
    build_b(nb, w, bq);
    let mut sums = Sums([[0; 256]; 2]);
    let mut loaded = 0;
    let mut t0 = 0;
    while t0 < t_len {
        let n = (t_len - t0).min(16);
        if n != loaded {
            // C tiles 0, 1: n tokens x 16 rows i32; A tiles 2, 5: n tokens x 64 quants;
            // B tiles 3, 4, 6, 7: 16 x (16 rows x 4 quants). Chunks alternate A/B sets.
            let nr = n as u8;
            TileConfig::new(&[
                (nr, 64),
                (nr, 64),
                (nr, 64),
                (16, 64),
                (16, 64),
                (nr, 64),
                (16, 64),
                (16, 64),
            ])
            .load();
            loaded = n;
        }
        let a_tile = panel.tile(t0);
        let mut chain = [_mm512_setzero_ps(); 16];
        for i in 0..nb {
            let a = a_tile.add(i * 4 * 1024);
            let b = bq.as_ptr().add(i * B_BYTES);
            let c = sums.0.as_mut_ptr() as *mut u8;
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tileloadd tmm2, [{a} + {s64} * 1]",
                "tileloadd tmm3, [{b} + {s64} * 1]",
                "tileloadd tmm4, [{b} + {s64} * 1 + 1024]",
                "tdpbsud tmm0, tmm2, tmm3",
                "tdpbssd tmm1, tmm2, tmm4",
                "tileloadd tmm5, [{a} + {s64} * 1 + 1024]",
                "tileloadd tmm6, [{b} + {s64} * 1 + 2048]",
                "tileloadd tmm7, [{b} + {s64} * 1 + 3072]",
                "tdpbsud tmm0, tmm5, tmm6",
                "tdpbssd tmm1, tmm5, tmm7",
                "tileloadd tmm2, [{a} + {s64} * 1 + 2048]",
                "tileloadd tmm3, [{b} + {s64} * 1 + 4096]",
                "tileloadd tmm4, [{b} + {s64} * 1 + 5120]",
                "tdpbsud tmm0, tmm2, tmm3",
                "tdpbssd tmm1, tmm2, tmm4",
                "tileloadd tmm5, [{a} + {s64} * 1 + 3072]",
                "tileloadd tmm6, [{b} + {s64} * 1 + 6144]",
                "tileloadd tmm7, [{b} + {s64} * 1 + 7168]",
                "tdpbsud tmm0, tmm5, tmm6",
                "tdpbssd tmm1, tmm5, tmm7",
                "tilestored [{c} + {s64} * 1], tmm0",
                "tilestored [{c} + {s64} * 1 + 1024], tmm1",
                a = in(reg) a, b = in(reg) b, c = in(reg) c, s64 = in(reg) 64usize,
                options(nostack),
            );
            let (_, meta) = offsets(i);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(w.as_ptr().add(meta) as *const __m256i));
            for t in 0..n {
                let lo = _mm512_load_si512(sums.0[0][16 * t..].as_ptr() as *const _);
                let hi = _mm512_load_si512(sums.0[1][16 * t..].as_ptr() as *const _);
                let isum = _mm512_add_epi32(lo, _mm512_slli_epi32::<7>(hi));
                let y = acts[t0 + t].as_ptr().add(i * Q8K_BYTES);
                let yd = _mm512_set1_ps((y as *const f32).read_unaligned());
                let f = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), d);
                chain[t] = _mm512_fmadd_ps(f, yd, chain[t]);
            }
        }
        for (t, c) in chain.iter().enumerate().take(n) {
            _mm512_storeu_ps(out.as_mut_ptr().add((t0 + t) * R), *c);
        }
        t0 += n;
    }
    release();
}
