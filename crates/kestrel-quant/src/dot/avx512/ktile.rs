//! The K-quant (Q4_K, Q6_K) register tiles: `MR` weight rows x `NR` activation rows per call,
//! behind `vec_dot_rows` and decode's `matvec_k`.

use super::*;
use crate::simd::dpwssd;

const K4: u8 = 4;
const K6: u8 = 6;

/// `vpshufb` control that fills 128-bit lane `k` with the i16 at index `idx[k]` (of the 8 i16
/// in that lane).
#[inline(always)]
unsafe fn pick16(idx: [i64; 4]) -> __m512i {
    let e = |s: i64| (2 * s) | ((2 * s + 1) << 8);
    let q = |s: i64| e(s) * 0x0001_0001_0001_0001;
    _mm512_set_epi64(
        q(idx[3]),
        q(idx[3]),
        q(idx[2]),
        q(idx[2]),
        q(idx[1]),
        q(idx[1]),
        q(idx[0]),
        q(idx[0]),
    )
}

/// The K-quant tile (`K`: Q4_K or Q6_K against Q8_K): `MR` weight rows x `NR` activation rows,
/// behind both `vec_dot_multi` (`MR = 1`) and `vec_dot_rows`, so the two agree bit for bit.
///
/// Per super-block and pair, four 64-element steps of `vpmaddubsw` (unsigned weight levels
/// x Q8_K quants, never saturating: 2 * 63 * 128 < 2^15) into `vpdpwssd` with the sub-block
/// scales, all into one 16-lane i32 sum; Q6_K's -32 offset seeds that sum as -32 * sc . bsums.
/// Then one convert and FMA by d * yd, and for Q4_K the mins (m . bsums, 4 lanes) by
/// -yd * dmin into the same f32 accumulator. Weight unpacking and scales are shared along a
/// row of the tile, activation gathers along a column.
#[inline(always)]
unsafe fn ktile<const MR: usize, const NR: usize, const K: u8>(
    nb: usize,
    x: [*const u8; MR],
    y: [*const u8; NR],
    batched: bool,
) -> [[f32; NR]; MR] {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    let bx: usize = if K == K4 { 144 } else { 210 };
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = [[_mm512_setzero_ps(); NR]; MR];
    // Q6_K in a matmul of 8 or more tokens: llama.cpp's tiled K-quant kernel, one f32 chain per
    // output: `acc = fma(float(isum) * d, yd, acc)` per super-block.
    let mut chain = [[0f32; NR]; MR];
    // The same chains for a 4 x 4 tile, lane 4c + r.
    let mut chain16 = _mm512_setzero_ps();
    for i in 0..nb {
        // Activation side.
        let mut yd = [0f32; NR];
        let mut q8s = [_mm_setzero_si128(); NR];
        let mut bs = [_mm512_setzero_si512(); NR];
        for c in 0..NR {
            let yb = y[c].add(i * 292);
            yd[c] = (yb as *const f32).read_unaligned();
            let bsums = _mm256_loadu_si256(yb.add(260) as *const __m256i);
            if K == K4 {
                q8s[c] = _mm_hadd_epi16(
                    _mm256_castsi256_si128(bsums),
                    _mm256_extracti128_si256::<1>(bsums),
                );
            } else {
                bs[c] = _mm512_zextsi256_si512(bsums);
            }
        }
        // Weight side: scales broadcast per 128-bit lane, mins, the i32 sums' seeds.
        let mut d = [0f32; MR];
        let mut dmin = [0f32; MR];
        let mut sc_lo = [_mm512_setzero_si512(); MR];
        let mut sc_hi = [_mm512_setzero_si512(); MR];
        let mut mins = [_mm_setzero_si128(); MR];
        let mut sumi = [[_mm512_setzero_si512(); NR]; MR];
        for r in 0..MR {
            let xb = x[r].add(i * bx);
            if K == K4 {
                d[r] = fp16(xb);
                dmin[r] = fp16(xb.add(2));
                let sp = xb.add(4) as *const u32;
                let mut u = [
                    sp.read_unaligned(),
                    sp.add(1).read_unaligned(),
                    sp.add(2).read_unaligned(),
                    0,
                ];
                u[3] = ((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4);
                let uaux = u[1] & KMASK1;
                u[1] = (u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4);
                u[2] = uaux;
                u[0] &= KMASK1;
                let ms = _mm256_cvtepu8_epi16(_mm_set_epi32(
                    u[3] as i32,
                    u[2] as i32,
                    u[1] as i32,
                    u[0] as i32,
                ));
                mins[r] = _mm256_extracti128_si256::<1>(ms);
                sc_lo[r] = _mm512_broadcast_i32x4(_mm256_castsi256_si128(ms));
            } else {
                d[r] = fp16(xb.add(208));
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb.add(192) as *const __m128i));
                sc_lo[r] = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16));
                sc_hi[r] = _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(sc16));
                let nsc = _mm512_zextsi256_si512(_mm256_sub_epi16(
                    _mm256_setzero_si256(),
                    _mm256_slli_epi16::<5>(sc16),
                ));
                for c in 0..NR {
                    sumi[r][c] = dpwssd(_mm512_setzero_si512(), nsc, bs[c]);
                }
            }
        }
        for p in 0..4usize {
            let (h, hi) = (p / 2, p % 2 == 1);
            // 64 activation quants matching step p's weight lanes.
            let mut a = [_mm512_setzero_si512(); NR];
            for c in 0..NR {
                let q8 = y[c].add(i * 292 + 4);
                a[c] = if K == K4 {
                    let base = q8.add(128 * h + if hi { 32 } else { 0 });
                    _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(_mm256_loadu_si256(base as *const __m256i)),
                        _mm256_loadu_si256(base.add(64) as *const __m256i),
                    )
                } else {
                    _mm512_loadu_si512(q8.add(64 * p) as *const _)
                };
            }
            // Scale pick: Q4_K step (h, hi) holds sub-blocks 4h + hi (lanes 0, 1) and
            // 4h + 2 + hi (lanes 2, 3); Q6_K step p holds sub-blocks 4p..4p + 4, one per lane.
            let s = (4 * h + hi as usize) as i64;
            let ctl = if K == K4 {
                pick16([s, s, s + 2, s + 2])
            } else {
                let b = (4 * p % 8) as i64;
                pick16([b, b + 1, b + 2, b + 3])
            };
            for r in 0..MR {
                let xb = x[r].add(i * bx);
                let wq = if K == K4 {
                    let bits = _mm512_loadu_si512(xb.add(16 + 64 * h) as *const _);
                    if hi {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(bits), m4)
                    } else {
                        _mm512_and_si512(bits, m4)
                    }
                } else {
                    let ql = _mm512_loadu_si512(xb.add(64 * h) as *const _);
                    let lo4 = if hi { _mm512_srli_epi16::<4>(ql) } else { ql };
                    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        xb.add(128 + 32 * h) as *const __m256i
                    ));
                    // Elements 0..32 of the step take qh bits (0,1) or (4,5), 32..64 bits
                    // (2,3) or (6,7): moved to bits 4, 5 of each byte.
                    let t = if hi {
                        _mm512_srlv_epi16(
                            qh,
                            _mm512_set_epi64(
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0,
                                0,
                                0,
                                0,
                            ),
                        )
                    } else {
                        _mm512_sllv_epi16(
                            qh,
                            _mm512_set_epi64(
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0x0004_0004_0004_0004,
                                0x0004_0004_0004_0004,
                                0x0004_0004_0004_0004,
                                0x0004_0004_0004_0004,
                            ),
                        )
                    };
                    // (lo4 & 0x0f) | (t & 0x30)
                    _mm512_ternarylogic_epi32::<0xEC>(lo4, _mm512_and_si512(t, m30), m4)
                };
                let scv = if K == K4 || p < 2 { sc_lo[r] } else { sc_hi[r] };
                let sc = _mm512_shuffle_epi8(scv, ctl);
                for c in 0..NR {
                    let pr = _mm512_maddubs_epi16(wq, a[c]);
                    sumi[r][c] = dpwssd(sumi[r][c], pr, sc);
                }
            }
        }
        if K == K6 && batched && MR == 4 && NR == 4 {
            // The 16 integer sums at once (lane 4c + r), then the same f32 chain per lane.
            let isum = reduce16(std::array::from_fn(|k| sumi[k / NR][k % NR]));
            let dv = _mm512_broadcast_f32x4(_mm_set_ps(d[3 % MR], d[2 % MR], d[1 % MR], d[0]));
            let ydv = _mm512_permutexvar_ps(
                _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                _mm512_castps128_ps512(_mm_set_ps(yd[3 % NR], yd[2 % NR], yd[1 % NR], yd[0])),
            );
            chain16 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), dv), ydv, chain16);
            continue;
        }
        for r in 0..MR {
            for c in 0..NR {
                if K == K6 && batched {
                    let isum = _mm512_reduce_add_epi32(sumi[r][c]);
                    chain[r][c] = ((isum as f32) * d[r]).mul_add(yd[c], chain[r][c]);
                    continue;
                }
                if K == K6 {
                    // llama.cpp's 8 lanes: lane i gathers elements 4i..4i+3 of every 32, which
                    // are lanes i and i + 8 here (the -32 offset seeded lanes 0..8 as it does).
                    let s = sumi[r][c];
                    let s8 = _mm256_add_epi32(
                        _mm512_castsi512_si256(s),
                        _mm512_extracti64x4_epi64::<1>(s),
                    );
                    let a = _mm256_fmadd_ps(
                        _mm256_set1_ps(d[r] * yd[c]),
                        _mm256_cvtepi32_ps(s8),
                        _mm512_castps512_ps256(acc[r][c]),
                    );
                    acc[r][c] = _mm512_zextps256_ps512(a);
                    continue;
                }
                acc[r][c] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(sumi[r][c]),
                    _mm512_set1_ps(d[r] * yd[c]),
                    acc[r][c],
                );
                if K == K4 {
                    let m = _mm_cvtepi32_ps(_mm_madd_epi16(mins[r], q8s[c]));
                    acc[r][c] = _mm512_fmadd_ps(
                        _mm512_zextps128_ps512(m),
                        _mm512_set1_ps(-yd[c] * dmin[r]),
                        acc[r][c],
                    );
                }
            }
        }
    }
    let mut out = [[0f32; NR]; MR];
    let mut lanes16 = [0f32; 16];
    _mm512_storeu_ps(lanes16.as_mut_ptr(), chain16);
    for r in 0..MR {
        for c in 0..NR {
            out[r][c] = if K == K6 && batched && MR == 4 && NR == 4 {
                lanes16[4 * c + r]
            } else if K == K6 && batched {
                chain[r][c]
            } else if K == K6 {
                hsum8(_mm512_castps512_ps256(acc[r][c]))
            } else {
                _mm512_reduce_add_ps(acc[r][c])
            };
        }
    }
    out
}

/// Horizontal sums of 16 vectors in one: lane `4k + j` of the result is the sum of `v[4j + k]`
/// (a transposing tree, 45 vector ops instead of 16 separate reductions of ~9 each).
#[inline(always)]
unsafe fn reduce16(v: [__m512i; 16]) -> __m512i {
    // Pairs: 128-bit lanes 0, 1 carry v[2m]'s halves summed, lanes 2, 3 v[2m + 1]'s.
    let w: [__m512i; 8] = std::array::from_fn(|m| {
        let (a, b) = (v[2 * m], v[2 * m + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0x44>(a, b),
            _mm512_shuffle_i64x2::<0xEE>(a, b),
        )
    });
    // Quads: 128-bit lane k carries v[4m + k]'s four partial sums.
    let x: [__m512i; 4] = std::array::from_fn(|m| {
        let (a, b) = (w[2 * m], w[2 * m + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0x88>(a, b),
            _mm512_shuffle_i64x2::<0xDD>(a, b),
        )
    });
    let y: [__m512i; 2] = std::array::from_fn(|m| {
        let (a, b) = (x[2 * m], x[2 * m + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
    });
    _mm512_add_epi32(
        _mm512_unpacklo_epi64(y[0], y[1]),
        _mm512_unpackhi_epi64(y[0], y[1]),
    )
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn ktile_q4k<const MR: usize, const NR: usize>(
    nb: usize,
    x: [*const u8; MR],
    y: [*const u8; NR],
) -> [[f32; NR]; MR] {
    ktile::<MR, NR, K4>(nb, x, y, false)
}

/// Decode over `out.len()` consecutive K-quant rows (`row_bytes` apart from `x`) against one
/// activation row: the one-row kernel ([`ktile`], so the same bits as [`dot512`]) inlined into
/// the row loop, its constants and the call set up once per matvec instead of once per row.
///
/// # Safety
/// AVX-512 VNNI is available; `w` is Q4_K or Q6_K; `x` holds `out.len()` rows of `nb` blocks;
/// `y` holds `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn matvec_k(
    w: GgmlType,
    nb: usize,
    x: *const u8,
    row_bytes: usize,
    y: *const u8,
    out: &mut [f32],
) {
    if w == GgmlType::Q4_K {
        for (r, o) in out.iter_mut().enumerate() {
            *o = ktile::<1, 1, K4>(nb, [x.add(r * row_bytes)], [y], false)[0][0];
        }
    } else {
        for (r, o) in out.iter_mut().enumerate() {
            *o = ktile::<1, 1, K6>(nb, [x.add(r * row_bytes)], [y], false)[0][0];
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn ktile_q6k<const MR: usize, const NR: usize>(
    nb: usize,
    x: [*const u8; MR],
    y: [*const u8; NR],
    batched: bool,
) -> [[f32; NR]; MR] {
    ktile::<MR, NR, K6>(nb, x, y, batched)
}
