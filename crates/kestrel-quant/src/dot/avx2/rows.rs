//! Decode and batched decode over the 32-element block types on AVX2: four weight rows at a
//! time, straight from the file's layout, against one or two activation rows whose block
//! scales were converted once per call. Four rows keep four (eight) accumulators in flight
//! where one row's dot chains each block's FMA on the previous one's, convert their four
//! scales in one `vcvtph2ps`, and load each activation block once. Q4_0's, Q4_1's, Q5_0's and
//! Q5_1's levels enter unsigned, as stored (no sign trick: two `vpsignb` fewer a block), and Q4_0's
//! and Q5_0's offset comes off the i32 lanes (`off * sum of 4 activations`, once per token and
//! block); Q8_0 takes the sign trick.
//!
//! Per row and token the steps are [`dot`](super::dot)'s (llama.cpp's AVX2 ones): the same
//! integer lanes, `acc = fma(dx * dy, lanes, acc)` in block order, `hsum8`, then the mins'
//! (Q4_1, Q5_1) `fma(m, s, summs)`; so the results equal it bit for bit.

// Per-row and per-token register arrays are indexed by constant loop counters (unrolled).
#![allow(clippy::needless_range_loop)]

use super::super::x86::*;
use super::{layout, levels, offset, with_min, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use kestrel_gguf::GgmlType;

/// `out[r * t + c] = row r . acts[c]` for `rows` rows of `row_bytes` at `x` and the `t =
/// acts.len()` activation rows, whose block scales are `dy[c * nb..][..nb]` as f32.
///
/// # Safety
/// AVX2, FMA and F16C are available; `w` is Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0; the rows hold `nb`
/// blocks of `w` and the activations `nb` blocks of its `vec_dot_type`; `out` has
/// `rows * t` and `dy` `t * nb`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul(
    w: GgmlType,
    nb: usize,
    x: *const u8,
    row_bytes: usize,
    acts: &[&[u8]],
    dy: &[f32],
    out: &mut [f32],
) {
    match w {
        GgmlType::Q4_0 => matmul_t::<Q4_0>(nb, x, row_bytes, acts, dy, out),
        GgmlType::Q5_0 => matmul_t::<Q5_0>(nb, x, row_bytes, acts, dy, out),
        GgmlType::Q8_0 => matmul_t::<Q8_0>(nb, x, row_bytes, acts, dy, out),
        GgmlType::Q5_1 => matmul_t::<Q5_1>(nb, x, row_bytes, acts, dy, out),
        _ => matmul_t::<Q4_1>(nb, x, row_bytes, acts, dy, out),
    }
}

#[inline(always)]
unsafe fn matmul_t<const T: u8>(
    nb: usize,
    x: *const u8,
    row_bytes: usize,
    acts: &[&[u8]],
    dy: &[f32],
    out: &mut [f32],
) {
    let t = acts.len();
    let rows = out.len() / t.max(1);
    let mut r0 = 0;
    while r0 < rows {
        let xr = x.add(r0 * row_bytes);
        // The rows after these (contiguous), prefetched as these are read: interleaved rows
        // are short streams that the hardware prefetcher does not follow (Q4_0 decode from
        // DRAM 9.5 -> 17 GB/s a core).
        let next = xr.wrapping_add(MR * row_bytes);
        let mut c = 0;
        while c < t {
            let (y, d) = (
                |c: usize| acts[c].as_ptr(),
                |c: usize| dy[c * nb..].as_ptr(),
            );
            let mut put = |v: &[f32], r: usize, c: usize| out[(r0 + r) * t + c] = v[0];
            match (rows - r0, t - c) {
                (k, 1) if k >= MR => {
                    let v = row_tile::<T, MR, 1>(nb, xr, row_bytes, next, [y(c)], [d(c)]);
                    v.iter().enumerate().for_each(|(r, v)| put(v, r, c));
                }
                (k, _) if k >= MR => {
                    let v = row_tile::<T, MR, 2>(
                        nb,
                        xr,
                        row_bytes,
                        next,
                        [y(c), y(c + 1)],
                        [d(c), d(c + 1)],
                    );
                    v.iter().enumerate().for_each(|(r, v)| {
                        put(&v[..1], r, c);
                        put(&v[1..], r, c + 1);
                    });
                }
                (_, 1) => put(
                    &row_tile::<T, 1, 1>(nb, xr, row_bytes, next, [y(c)], [d(c)])[0],
                    0,
                    c,
                ),
                _ => {
                    let v = row_tile::<T, 1, 2>(
                        nb,
                        xr,
                        row_bytes,
                        next,
                        [y(c), y(c + 1)],
                        [d(c), d(c + 1)],
                    );
                    put(&v[0][..1], 0, c);
                    put(&v[0][1..], 0, c + 1);
                }
            }
            c += if t - c >= 2 { 2 } else { 1 };
        }
        r0 += if rows - r0 >= MR { MR } else { 1 };
    }
}

/// Rows per tile.
const MR: usize = 4;

/// `M` rows from `x` (`stride` bytes apart) against `N` activation rows `y` (block scales
/// `dy`): `[row][token]`. `next` is prefetched along.
#[inline(always)]
unsafe fn row_tile<const T: u8, const M: usize, const N: usize>(
    nb: usize,
    x: *const u8,
    stride: usize,
    next: *const u8,
    y: [*const u8; N],
    dy: [*const f32; N],
) -> [[f32; N]; M] {
    let (bx, by, qoff) = layout(T);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); N]; M];
    // Q4_1's and Q5_1's m . sy.
    let mut summ = [[0f32; N]; M];
    for i in 0..nb {
        #[cfg(target_arch = "x86_64")]
        if M > 1 {
            // The lines the next rows' bytes of this step fall on (M * bx: 72 to 136).
            let p = next.wrapping_add(M * i * bx) as *const i8;
            let mut line = 0;
            while line < M * bx + 64 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line));
                line += 64;
            }
        }
        let b = |r: usize| x.add(r * stride + i * bx);
        // The rows' f16 scales side by side in one register, widened at once.
        let packed = (0..M).fold(0u64, |p, r| {
            p | ((b(r) as *const u16).read_unaligned() as u64) << (16 * r)
        });
        let dx = _mm_cvtph_ps(_mm_set_epi64x(0, packed as i64));
        // [token][row]: dx * dy, each product the scalar one.
        let mut d = [[0f32; 4]; N];
        for (c, dc) in d.iter_mut().enumerate() {
            _mm_storeu_ps(dc.as_mut_ptr(), _mm_mul_ps(dx, _mm_set1_ps(*dy[c].add(i))));
        }
        let ys: [__m256i; N] =
            std::array::from_fn(|c| _mm256_loadu_si256(y[c].add(i * by + qoff) as *const __m256i));
        // Q4_0's and Q5_0's offset times each 4 activations: what the unsigned levels add.
        let off = _mm256_set1_epi8(offset(T));
        let corr: [__m256i; N] =
            std::array::from_fn(|c| _mm256_madd_epi16(_mm256_maddubs_epi16(off, ys[c]), ones));
        // Q4_1's and Q5_1's activation sums `s` of this block.
        let sy: [f32; N] = std::array::from_fn(|c| {
            if with_min(T) {
                fp16(y[c].add(i * by + 2))
            } else {
                0.0
            }
        });
        for r in 0..M {
            let u = levels::<T>(b(r));
            let au = _mm256_sign_epi8(u, u);
            for c in 0..N {
                let lanes = match T {
                    // The sign trick: |q| against sign(y, q).
                    Q8_0 => _mm256_madd_epi16(
                        _mm256_maddubs_epi16(au, _mm256_sign_epi8(ys[c], u)),
                        ones,
                    ),
                    Q4_1 | Q5_1 => _mm256_madd_epi16(_mm256_maddubs_epi16(u, ys[c]), ones),
                    _ => _mm256_sub_epi32(
                        _mm256_madd_epi16(_mm256_maddubs_epi16(u, ys[c]), ones),
                        corr[c],
                    ),
                };
                let lanes = _mm256_cvtepi32_ps(lanes);
                acc[r][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[c][r]), lanes, acc[r][c]);
            }
            if with_min(T) {
                let m = fp16(b(r).add(2));
                for c in 0..N {
                    summ[r][c] = m.mul_add(sy[c], summ[r][c]);
                }
            }
        }
    }
    let mut out = [[0f32; N]; M];
    for r in 0..M {
        for c in 0..N {
            out[r][c] = hsum8(acc[r][c]) + summ[r][c];
        }
    }
    out
}
