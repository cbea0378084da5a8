//! llama.cpp's tiled CPU flash attention (prompts of 64+ queries per sequence): a tile of up to
//! 64 queries of one kv head's group against the cache in blocks of `GGML_TILE_KV` positions.

use super::*;
use half::slice::HalfFloatSliceExt;

/// Up to 64 consecutive queries of one sequence (one kv head's group of query heads).
pub(super) struct QueryTile<'a> {
    pub(super) tokens: &'a [TokenKv<'a>],
    pub(super) q: &'a [f32],
    /// Offset of the first token's group in `q`; token i's is `q_off + i * q_dim`.
    pub(super) q_off: usize,
    pub(super) q_dim: usize,
    pub(super) group: usize,
    pub(super) block_size: usize,
}

/// Positions per KV tile of llama.cpp's tiled flash attention.
const GGML_TILE_KV: usize = 64;

/// `_mm512_reduce_add_ps` as GCC expands it: halves, then quarters, then pairs.
#[inline(always)]
fn reduce16_gcc(x: &[f32]) -> f32 {
    let mut t3 = [0f32; 8];
    for i in 0..8 {
        t3[i] = x[8 + i] + x[i];
    }
    let t6 = [t3[4] + t3[0], t3[5] + t3[1], t3[6] + t3[2], t3[7] + t3[3]];
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// llama.cpp's tiled flash attention for 64 or more queries of a sequence
/// (`ggml_compute_forward_flash_attn_ext_tiled`), operation for operation: f32 queries; per
/// 64-position KV tile the scores as one FMA chain over the head dimension from zero, scaled,
/// masked to -inf; the running max updated once per tile (`expf` rescale of the f32 accumulator
/// and sum); probabilities by `ggml_v_expf` in 16-lane groups summed in f64 through GCC's
/// reduction; the accumulator as one FMA chain per element over the tile's positions; finally
/// divided by the sum. GEMM-shaped, so it is also the fast path for long prompts.
pub(super) fn attend_tile_ggml<'a>(
    tile: &QueryTile,
    rows: &Rows,
    scale: f32,
    dst: impl Fn(usize) -> &'a mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::vexp::has_avx512() && has_f16c() {
        // SAFETY: AVX-512 F, FMA and F16C are available.
        unsafe { attend_tile_avx512(tile, rows, scale, &dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: AVX2, FMA and F16C are available.
        unsafe { attend_tile_avx2(tile, rows, scale, &dst) };
        return;
    }
    attend_tile_body(tile, rows, scale, &dst);
}

/// The AVX2 form of [`attend_tile_body`]: two (query, head) rows at a time share each K and V
/// vector load, half a KV tile (32 positions, 4 x 8 lanes) of scores per pass and 32 output
/// dims of weighted sums per pass (16 accumulators fit the 16 registers); every lane's FMA
/// chain runs in the body's order, so the result is bit-identical to it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // register arrays indexed in lockstep
pub(super) unsafe fn attend_tile_avx2<'a>(
    tile: &QueryTile,
    rows: &Rows,
    scale: f32,
    dst: &dyn Fn(usize) -> &'a mut [f32],
) {
    use std::arch::x86_64::*;
    const KT: usize = GGML_TILE_KV;
    const RB: usize = 2;
    let d = rows.head_dim;
    if !d.is_multiple_of(32) {
        attend_tile_body(tile, rows, scale, dst);
        return;
    }
    let nq = tile.tokens.len();
    let g = tile.group;
    let last_pos = tile.tokens.iter().map(|t| t.pos).max().unwrap_or(0);
    let mut m = vec![f32::NEG_INFINITY; nq * g];
    let mut sum = vec![0f32; nq * g];
    let mut acc = vec![0f32; nq * g * d];
    let mut kt = vec![0f32; d * KT];
    let mut v32 = vec![0f32; KT * d];
    let mut s = vec![0f32; RB * KT];
    let mut active: Vec<usize> = Vec::with_capacity(nq * g);
    for base in (0..=last_pos).step_by(KT) {
        let n_here = KT.min(last_pos + 1 - base);
        fill_tile(tile, rows, base, n_here, &mut kt, &mut v32);
        active_rows(tile, base, &mut active);
        for grp in active.chunks(RB) {
            let n = grp.len();
            let qp: [*const f32; RB] = std::array::from_fn(|r| {
                let i = grp[r.min(n - 1)];
                let (qi, h) = (i / g, i % g);
                tile.q.as_ptr().add(tile.q_off + qi * tile.q_dim + h * d)
            });
            // Scores: one FMA chain per (row, position) over the head dimension.
            for half in 0..2 {
                let at = 32 * half;
                let mut sc = [[_mm256_setzero_ps(); 4]; RB];
                for dd in 0..d {
                    let kv: [__m256; 4] = std::array::from_fn(|j| {
                        _mm256_loadu_ps(kt.as_ptr().add(dd * KT + at + 8 * j))
                    });
                    for r in 0..RB {
                        let qb = _mm256_set1_ps(*qp[r].add(dd));
                        for j in 0..4 {
                            sc[r][j] = _mm256_fmadd_ps(kv[j], qb, sc[r][j]);
                        }
                    }
                }
                for r in 0..n {
                    for j in 0..4 {
                        _mm256_storeu_ps(s.as_mut_ptr().add(r * KT + at + 8 * j), sc[r][j]);
                    }
                }
            }
            for (r, &i) in grp.iter().enumerate() {
                let limit = (tile.tokens[i / g].pos + 1 - base).min(n_here);
                let a = &mut acc[i * d..(i + 1) * d];
                softmax_tile_row(
                    &mut s[r * KT..(r + 1) * KT],
                    limit,
                    scale,
                    &mut m[i],
                    &mut sum[i],
                    a,
                );
            }
            // Weighted sums: one FMA chain per (row, dim) over the tile's positions.
            for dv in (0..d).step_by(32) {
                let mut av = [[_mm256_setzero_ps(); 4]; RB];
                for r in 0..n {
                    for j in 0..4 {
                        av[r][j] = _mm256_loadu_ps(acc.as_ptr().add(grp[r] * d + dv + 8 * j));
                    }
                }
                for k in 0..KT {
                    let vk: [__m256; 4] = std::array::from_fn(|j| {
                        _mm256_loadu_ps(v32.as_ptr().add(k * d + dv + 8 * j))
                    });
                    for r in 0..RB {
                        let p = _mm256_set1_ps(s[r.min(n - 1) * KT + k]);
                        for j in 0..4 {
                            av[r][j] = _mm256_fmadd_ps(vk[j], p, av[r][j]);
                        }
                    }
                }
                for r in 0..n {
                    for j in 0..4 {
                        _mm256_storeu_ps(acc.as_mut_ptr().add(grp[r] * d + dv + 8 * j), av[r][j]);
                    }
                }
            }
        }
    }
    write_tile(tile, d, &acc, &sum, dst);
}

/// The AVX-512 form of [`attend_tile_body`]: four (query, head) rows at a time share each
/// K and V vector load (scores and weighted sums as 16-lane FMA chains in the same order), the
/// per-row softmax steps as in the body; bit-identical to it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // register arrays indexed in lockstep
unsafe fn attend_tile_avx512<'a>(
    tile: &QueryTile,
    rows: &Rows,
    scale: f32,
    dst: &dyn Fn(usize) -> &'a mut [f32],
) {
    use std::arch::x86_64::*;
    const KT: usize = GGML_TILE_KV;
    const RB: usize = 4;
    let d = rows.head_dim;
    if !d.is_multiple_of(64) {
        attend_tile_body(tile, rows, scale, dst);
        return;
    }
    let nq = tile.tokens.len();
    let g = tile.group;
    let last_pos = tile.tokens.iter().map(|t| t.pos).max().unwrap_or(0);
    let mut m = vec![f32::NEG_INFINITY; nq * g];
    let mut sum = vec![0f32; nq * g];
    let mut acc = vec![0f32; nq * g * d];
    let mut kt = vec![0f32; d * KT];
    let mut v32 = vec![0f32; KT * d];
    let mut s = vec![0f32; RB * KT];
    let mut active: Vec<usize> = Vec::with_capacity(nq * g);
    for base in (0..=last_pos).step_by(KT) {
        let n_here = KT.min(last_pos + 1 - base);
        fill_tile(tile, rows, base, n_here, &mut kt, &mut v32);
        active_rows(tile, base, &mut active);
        for grp in active.chunks(RB) {
            let n = grp.len();
            // Scores: one FMA chain per (row, position) over the head dimension.
            let mut sc = [[_mm512_setzero_ps(); 4]; RB];
            let qp: [*const f32; RB] = std::array::from_fn(|r| {
                let i = grp[r.min(n - 1)];
                let (qi, h) = (i / g, i % g);
                tile.q.as_ptr().add(tile.q_off + qi * tile.q_dim + h * d)
            });
            for dd in 0..d {
                let kv: [__m512; 4] =
                    std::array::from_fn(|j| _mm512_loadu_ps(kt.as_ptr().add(dd * KT + 16 * j)));
                for r in 0..RB {
                    let qb = _mm512_set1_ps(*qp[r].add(dd));
                    for j in 0..4 {
                        sc[r][j] = _mm512_fmadd_ps(kv[j], qb, sc[r][j]);
                    }
                }
            }
            for r in 0..n {
                for j in 0..4 {
                    _mm512_storeu_ps(s.as_mut_ptr().add(r * KT + 16 * j), sc[r][j]);
                }
            }
            for (r, &i) in grp.iter().enumerate() {
                let limit = (tile.tokens[i / g].pos + 1 - base).min(n_here);
                let a = &mut acc[i * d..(i + 1) * d];
                softmax_tile_row(
                    &mut s[r * KT..(r + 1) * KT],
                    limit,
                    scale,
                    &mut m[i],
                    &mut sum[i],
                    a,
                );
            }
            // Weighted sums: one FMA chain per (row, dim) over the tile's positions.
            for dv in (0..d).step_by(64) {
                let mut av = [[_mm512_setzero_ps(); 4]; RB];
                for r in 0..n {
                    for j in 0..4 {
                        av[r][j] = _mm512_loadu_ps(acc.as_ptr().add(grp[r] * d + dv + 16 * j));
                    }
                }
                for k in 0..KT {
                    let vk: [__m512; 4] = std::array::from_fn(|j| {
                        _mm512_loadu_ps(v32.as_ptr().add(k * d + dv + 16 * j))
                    });
                    for r in 0..RB {
                        let p = _mm512_set1_ps(s[r.min(n - 1) * KT + k]);
                        for j in 0..4 {
                            av[r][j] = _mm512_fmadd_ps(vk[j], p, av[r][j]);
                        }
                    }
                }
                for r in 0..n {
                    for j in 0..4 {
                        _mm512_storeu_ps(acc.as_mut_ptr().add(grp[r] * d + dv + 16 * j), av[r][j]);
                    }
                }
            }
        }
    }
    write_tile(tile, d, &acc, &sum, dst);
}

#[inline(always)]
pub(super) fn attend_tile_body<'a>(
    tile: &QueryTile,
    rows: &Rows,
    scale: f32,
    dst: &dyn Fn(usize) -> &'a mut [f32],
) {
    const KT: usize = GGML_TILE_KV;
    let d = rows.head_dim;
    let nq = tile.tokens.len();
    let g = tile.group;
    let last_pos = tile.tokens.iter().map(|t| t.pos).max().unwrap_or(0);
    let mut m = vec![f32::NEG_INFINITY; nq * g];
    let mut sum = vec![0f32; nq * g];
    let mut acc = vec![0f32; nq * g * d];
    let mut kt = vec![0f32; d * KT]; // [dim][position]
    let mut v32 = vec![0f32; KT * d]; // [position][dim]
    let mut s = [0f32; KT];
    for base in (0..=last_pos).step_by(KT) {
        let n_here = KT.min(last_pos + 1 - base);
        fill_tile(tile, rows, base, n_here, &mut kt, &mut v32);
        for (qi, tok) in tile.tokens.iter().enumerate() {
            if base > tok.pos {
                continue; // every position of this tile is masked for this query
            }
            let qrow = &tile.q[tile.q_off + qi * tile.q_dim..][..g * d];
            for h in 0..g {
                let qh = &qrow[h * d..(h + 1) * d];
                s.fill(0.0);
                for (dd, &qd) in qh.iter().enumerate() {
                    let kd = &kt[dd * KT..(dd + 1) * KT];
                    for (sk, &kv) in s.iter_mut().zip(kd) {
                        *sk = kv.mul_add(qd, *sk);
                    }
                }
                let i = qi * g + h;
                let limit = (tok.pos + 1 - base).min(n_here);
                let a = &mut acc[i * d..(i + 1) * d];
                softmax_tile_row(&mut s, limit, scale, &mut m[i], &mut sum[i], a);
                for (k, &p) in s.iter().enumerate() {
                    let vk = &v32[k * d..(k + 1) * d];
                    for (x, &vv) in a.iter_mut().zip(vk) {
                        *x = vv.mul_add(p, *x);
                    }
                }
            }
        }
    }
    write_tile(tile, d, &acc, &sum, dst);
}

/// One KV tile (positions `base..base + n_here` of the tile's sequence) widened to f32 for
/// the kernels: `kt` as [dim][position], `v32` as [position][dim], zero past `n_here`.
fn fill_tile(
    tile: &QueryTile,
    rows: &Rows,
    base: usize,
    n_here: usize,
    kt: &mut [f32],
    v32: &mut [f32],
) {
    let d = rows.head_dim;
    let (blocks, bs) = (tile.tokens[0].blocks, tile.block_size);
    kt.fill(0.0);
    v32.fill(0.0);
    let mut k_row = [0f32; 256];
    for k in 0..n_here {
        let pos = base + k;
        let row = blocks[pos / bs] as usize * bs + pos % bs;
        if d <= k_row.len() {
            rows.k(row).convert_to_f32_slice(&mut k_row[..d]);
            for (dd, &x) in k_row[..d].iter().enumerate() {
                kt[dd * GGML_TILE_KV + k] = x;
            }
        } else {
            for (dd, x) in rows.k(row).iter().enumerate() {
                kt[dd * GGML_TILE_KV + k] = x.to_f32();
            }
        }
        rows.v(row)
            .convert_to_f32_slice(&mut v32[k * d..(k + 1) * d]);
    }
}

/// The (query, head) rows (`query * group + head`) that see some position from `base` on.
fn active_rows(tile: &QueryTile, base: usize, active: &mut Vec<usize>) {
    let g = tile.group;
    active.clear();
    for (qi, tok) in tile.tokens.iter().enumerate() {
        if base <= tok.pos {
            active.extend((0..g).map(|h| qi * g + h));
        }
    }
}

/// Every query's heads, `acc / sum`, into its destination.
fn write_tile<'a>(
    tile: &QueryTile,
    d: usize,
    acc: &[f32],
    sum: &[f32],
    dst: &dyn Fn(usize) -> &'a mut [f32],
) {
    let g = tile.group;
    for qi in 0..tile.tokens.len() {
        let at = qi * g;
        write_normalized(dst(qi), &acc[at * d..(at + g) * d], &sum[at..at + g], d);
    }
}

/// One query row's softmax step for a KV tile, as llama.cpp's tiled kernel takes it: scores
/// scaled, positions from `limit` on masked to -inf, the running max and sum updated once for
/// the tile (the accumulator `acc` rescaled by libm's `expf`), then `s` turned into
/// `ggml_v_expf(s - max)` with their sum added in f64.
#[inline(always)]
fn softmax_tile_row(
    s: &mut [f32],
    limit: usize,
    scale: f32,
    m: &mut f32,
    sum: &mut f32,
    acc: &mut [f32],
) {
    let mut tile_max = f32::NEG_INFINITY;
    for (k, sk) in s.iter_mut().enumerate() {
        *sk *= scale;
        if k >= limit {
            *sk = f32::NEG_INFINITY;
        } else {
            *sk += 0.0;
        }
        tile_max = tile_max.max(*sk);
    }
    let m_new = m.max(tile_max);
    if m_new > *m {
        let ms = (*m - m_new).exp();
        acc.iter_mut().for_each(|x| *x *= ms);
        *sum *= ms;
    }
    *m = m_new;
    let mut total = 0f64;
    for chunk in s.chunks_exact_mut(16) {
        exp16_minus(chunk, m_new);
        total += reduce16_gcc(chunk) as f64;
    }
    *sum = (*sum as f64 + total) as f32;
}

/// `x[i] = ggml_v_expf(x[i] - m)` over 16 lanes.
#[inline(always)]
fn exp16_minus(x: &mut [f32], m: f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::vexp::has_avx512() {
        use std::arch::x86_64::*;
        // SAFETY: AVX-512 F is available; `x` holds 16 floats.
        unsafe {
            let v = _mm512_sub_ps(_mm512_loadu_ps(x.as_ptr()), _mm512_set1_ps(m));
            _mm512_storeu_ps(x.as_mut_ptr(), crate::vexp::expf16(v));
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::vexp::has_avx2() {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 and FMA are available; `x` holds 16 floats.
        unsafe {
            for h in x.chunks_exact_mut(8) {
                let v = _mm256_sub_ps(_mm256_loadu_ps(h.as_ptr()), _mm256_set1_ps(m));
                _mm256_storeu_ps(h.as_mut_ptr(), crate::vexp::expf8(v));
            }
        }
        return;
    }
    for v in x.iter_mut() {
        *v = crate::vexp::expf_lane(*v - m);
    }
}
