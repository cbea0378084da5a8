//! Causal grouped-query attention over the KV cache, one pass with an online softmax
//! (FlashAttention's recurrence): scratch per (token, kv head) is O(group x head_dim), never
//! O(context²), whatever the prompt length.
//!
//! With an f16 cache the arithmetic follows ggml's CPU flash attention where it matters for
//! parity: q rounded to f16, f32 dot products, the V accumulator rounded to f16 after every
//! position and at every rescale (measured: 20 of 24 fixture prompts within llama.cpp's near-tie
//! rule, 17 with an f32 accumulator). Each task takes one token and one kv head and serves all query
//! heads of its group, so every K/V row is read and converted once per group; the SIMD kernel
//! goes through the cache in blocks of 16 positions (scores, one rescale and vectorized exps
//! per block, then the weighted V sum), FlashAttention-2's order.

use crate::kv::KvPool;
use crate::pool::{SharedMut, ThreadPool};
use half::f16;

/// Where one token of the step attends: its position and its sequence's block table.
pub struct TokenKv<'a> {
    pub pos: usize,
    pub blocks: &'a [u32],
    /// The sequence's queries of this step read the cache together (the tiled kernel) even
    /// when they are few: a speculative verify pass, whose k + 1 queries would otherwise each
    /// stream the whole context.
    pub tiled: bool,
}

/// `out[t, h, :] = softmax(q[t,h] · K[0..=pos_t, h/group]ᵀ / sqrt(d)) · V[...]`
///
/// `q` and `out` are `[T, n_heads * head_dim]`; the pool already holds positions `0..=pos_t`
/// of every token's sequence in `layer`.
#[allow(clippy::too_many_arguments)]
pub fn causal_attention(
    pool: &ThreadPool,
    kv: &KvPool,
    layer: usize,
    q: &[f32],
    tokens: &[TokenKv],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    out: &mut [f32],
) {
    let q_dim = n_heads * head_dim;
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let out_ptr = SharedMut::new(out);
    let kv_dim = kv.kv_dim();
    let block_size = kv.block_size();
    // Per token: whether its sequence brings fewer than `GGML_TILE_Q` queries to this step
    // (decode, short prompts), where llama.cpp runs its one-query-at-a-time kernel.
    let mut few_queries = vec![false; tokens.len()];
    let mut single_query = vec![false; tokens.len()];
    let mut start = 0;
    while start < tokens.len() {
        let same = |t: &TokenKv| std::ptr::eq(t.blocks.as_ptr(), tokens[start].blocks.as_ptr());
        let n = tokens[start..].iter().take_while(|t| same(t)).count();
        few_queries[start..start + n].fill(n < GGML_TILE_Q && !(n > 1 && tokens[start].tiled));
        single_query[start..start + n].fill(n == 1);
        start += n;
    }
    // Work items: one (token, kv head) for the one-query kernels, or one (tile of up to 64
    // consecutive queries of a sequence, kv head) for llama.cpp's tiled kernel.
    let mut items: Vec<(usize, usize)> = Vec::new(); // (first token, count); count 0 = one query
    let mut t = 0;
    while t < tokens.len() {
        if few_queries[t] || kv.f16_layer(layer).is_none() {
            items.push((t, 0));
            t += 1;
            continue;
        }
        let same = |x: &TokenKv| std::ptr::eq(x.blocks.as_ptr(), tokens[t].blocks.as_ptr());
        let run = tokens[t..].iter().take_while(|x| same(x)).count();
        let n = run.min(GGML_TILE_Q);
        items.push((t, n));
        t += n;
    }
    pool.run(items.len() * n_kv_heads, &|task| {
        let (item, kvh) = (task / n_kv_heads, task % n_kv_heads);
        let (t, n) = items[item];
        let tok = &tokens[t];
        let span = Span {
            blocks: tok.blocks,
            block_size,
            n_pos: tok.pos + 1,
            first: 0,
        };
        match kv.f16_layer(layer) {
            Some((k, v)) => {
                let rows = Rows {
                    k,
                    v,
                    kv_dim,
                    kv_head: kvh,
                    head_dim,
                    block_size,
                };
                if n > 0 {
                    let tile = QueryTile {
                        tokens: &tokens[t..t + n],
                        q,
                        q_off: t * q_dim + kvh * group * head_dim,
                        q_dim,
                        group,
                        block_size,
                    };
                    // SAFETY: the group's heads of tokens t..t+n are written by this task only.
                    let dst = |i: usize| unsafe {
                        out_ptr.slice((t + i) * q_dim + kvh * group * head_dim, group * head_dim)
                    };
                    attend_tile_ggml(&tile, &rows, scale, dst);
                    return;
                }
                let q_off = t * q_dim + kvh * group * head_dim;
                let qg = &q[q_off..q_off + group * head_dim];
                // SAFETY: the group's heads of token t are written by this task only.
                let dst = unsafe { out_ptr.slice(q_off, group * head_dim) };
                if few_queries[t] {
                    let single = single_query[t];
                    attend_group_f16_ggml(qg, &rows, &span, scale, dst, single)
                } else {
                    attend_group_f16(qg, &rows, &span, scale, dst)
                }
            }
            None => {
                let q_off = t * q_dim + kvh * group * head_dim;
                let qg = &q[q_off..q_off + group * head_dim];
                // SAFETY: the group's heads of token t are written by this task only.
                let dst = unsafe { out_ptr.slice(q_off, group * head_dim) };
                attend_group_f32(kv, layer, kvh, qg, head_dim, &span, scale, dst)
            }
        }
    });
}

/// Up to 64 consecutive queries of one sequence (one kv head's group of query heads).
struct QueryTile<'a> {
    tokens: &'a [TokenKv<'a>],
    q: &'a [f32],
    /// Offset of the first token's group in `q`; token i's is `q_off + i * q_dim`.
    q_off: usize,
    q_dim: usize,
    group: usize,
    block_size: usize,
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
fn attend_tile_ggml<'a>(
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
    attend_tile_body(tile, rows, scale, &dst);
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
    let blocks = tile.tokens[0].blocks;
    let bs = tile.block_size;
    let mut m = vec![f32::NEG_INFINITY; nq * g];
    let mut sum = vec![0f32; nq * g];
    let mut acc = vec![0f32; nq * g * d];
    let mut kt = vec![0f32; d * KT];
    let mut v32 = vec![0f32; KT * d];
    let mut s = vec![0f32; RB * KT];
    let mut active: Vec<usize> = Vec::with_capacity(nq * g);
    for base in (0..=last_pos).step_by(KT) {
        let n_here = KT.min(last_pos + 1 - base);
        kt.fill(0.0);
        v32.fill(0.0);
        for k in 0..n_here {
            let pos = base + k;
            let row = blocks[pos / bs] as usize * bs + pos % bs;
            let kp = rows.k(row).as_ptr() as *const __m256i;
            for j in 0..d / 16 {
                let x = _mm512_cvtph_ps(_mm256_loadu_si256(kp.add(j)));
                let mut lanes = [0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), x);
                for (l, &v) in lanes.iter().enumerate() {
                    kt[(16 * j + l) * KT + k] = v;
                }
            }
            let vp = rows.v(row).as_ptr() as *const __m256i;
            for j in 0..d / 16 {
                let x = _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(j)));
                _mm512_storeu_ps(v32.as_mut_ptr().add(k * d + 16 * j), x);
            }
        }
        active.clear();
        for (qi, tok) in tile.tokens.iter().enumerate() {
            if base <= tok.pos {
                active.extend((0..g).map(|h| qi * g + h));
            }
        }
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
    for qi in 0..nq {
        let (at, n) = (qi * g, g);
        write_normalized(dst(qi), &acc[at * d..(at + n) * d], &sum[at..at + n], d);
    }
}

#[inline(always)]
fn attend_tile_body<'a>(
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
    let blocks = tile.tokens[0].blocks;
    let bs = tile.block_size;
    let mut m = vec![f32::NEG_INFINITY; nq * g];
    let mut sum = vec![0f32; nq * g];
    let mut acc = vec![0f32; nq * g * d];
    let mut kt = vec![0f32; d * KT]; // [dim][position]
    let mut v32 = vec![0f32; KT * d]; // [position][dim]
    let mut s = [0f32; KT];
    for base in (0..=last_pos).step_by(KT) {
        let n_here = KT.min(last_pos + 1 - base);
        kt.fill(0.0);
        v32.fill(0.0);
        for k in 0..n_here {
            let pos = base + k;
            let row = blocks[pos / bs] as usize * bs + pos % bs;
            for (dd, x) in rows.k(row).iter().enumerate() {
                kt[dd * KT + k] = x.to_f32();
            }
            for (o, x) in v32[k * d..(k + 1) * d].iter_mut().zip(rows.v(row)) {
                *o = x.to_f32();
            }
        }
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
    for qi in 0..nq {
        let (at, n) = (qi * g, g);
        write_normalized(dst(qi), &acc[at * d..(at + n) * d], &sum[at..at + n], d);
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
    for v in x.iter_mut() {
        *v = crate::vexp::expf_lane(*v - m);
    }
}

/// The pool rows of positions `0..n_pos` of one sequence, block by block.
struct Span<'a> {
    blocks: &'a [u32],
    block_size: usize,
    n_pos: usize,
    /// First position visited by [`Span::for_each_row`] (0 but for split decode).
    first: usize,
}

impl Span<'_> {
    /// Calls `f(first_row, n)` for each run of contiguous pool rows (one per block), in order.
    #[inline]
    fn for_each_run(&self, mut f: impl FnMut(usize, usize)) {
        let mut left = self.n_pos;
        for &b in self.blocks {
            if left == 0 {
                break;
            }
            let n = left.min(self.block_size);
            f(b as usize * self.block_size, n);
            left -= n;
        }
    }

    /// Calls `f(pos, first_row, n)` for each run of up to 16 positions from `first` on, in
    /// order, each inside one block (runs start 16-aligned within their block).
    #[inline]
    fn for_each_chunk16(&self, mut f: impl FnMut(usize, usize, usize)) {
        let mut pos = 0;
        for &b in self.blocks {
            if pos >= self.n_pos {
                break;
            }
            let n = (self.n_pos - pos).min(self.block_size);
            let start = b as usize * self.block_size;
            let mut c = self.first.saturating_sub(pos).min(n);
            while c < n {
                let len = (n - c).min(16 - c % 16);
                f(pos + c, start + c, len);
                c += len;
            }
            pos += n;
        }
    }

    /// The pool row of position `pos`, if the span holds it.
    #[inline]
    fn row_of(&self, pos: usize) -> Option<usize> {
        if pos >= self.n_pos {
            return None;
        }
        let b = *self.blocks.get(pos / self.block_size)?;
        Some(b as usize * self.block_size + pos % self.block_size)
    }

    /// Calls `f(row)` for every position from `first` in order, without a division per position.
    #[inline]
    fn for_each_row(&self, mut f: impl FnMut(usize)) {
        let mut pos = 0;
        for &b in self.blocks {
            if pos >= self.n_pos {
                break;
            }
            let n = (self.n_pos - pos).min(self.block_size);
            let base = b as usize * self.block_size;
            let skip = self.first.saturating_sub(pos).min(n);
            for row in base + skip..base + n {
                f(row);
            }
            pos += n;
        }
    }
}

/// The K/V rows of one kv head in a layer's f16 store (laid out as [`KvPool`]'s:
/// `[block][kv head][position in block][head_dim]`).
struct Rows<'a> {
    k: &'a [f16],
    v: &'a [f16],
    kv_dim: usize,
    kv_head: usize,
    head_dim: usize,
    block_size: usize,
}

impl Rows<'_> {
    /// Start of pool row `row`'s slice for this head.
    #[inline]
    fn at(&self, row: usize) -> usize {
        let (block, i) = (row / self.block_size, row % self.block_size);
        block * self.block_size * self.kv_dim + (self.kv_head * self.block_size + i) * self.head_dim
    }
    fn k(&self, row: usize) -> &[f16] {
        let s = self.at(row);
        &self.k[s..s + self.head_dim]
    }
    fn v(&self, row: usize) -> &[f16] {
        let s = self.at(row);
        &self.v[s..s + self.head_dim]
    }
    /// Rows `row0 .. row0 + n` of one block, contiguous: `n * head_dim` values each of K, V.
    fn run(&self, row0: usize, n: usize) -> (&[f16], &[f16]) {
        let s = self.at(row0);
        let len = n * self.head_dim;
        (&self.k[s..s + len], &self.v[s..s + len])
    }
}

fn attend_group_f16(qg: &[f32], rows: &Rows, span: &Span, scale: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if rows.head_dim.is_multiple_of(8) && has_f16c() {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked at run time).
            unsafe { x86::attend_group_f16(qg, rows, span, scale, out) };
            return;
        }
    }
    attend_group_f16_scalar(qg, rows, span, scale, out);
}

#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// Query rows from which llama.cpp's CPU flash attention switches to its tiled kernel.
const GGML_TILE_Q: usize = 64;

/// llama.cpp's one-query flash attention over an f16 cache
/// (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`), operation for operation: q rounded to
/// f16; each score a 4 x 16-lane f32 FMA dot reduced in GCC's `_mm512_reduce_add_ps` order;
/// the online softmax one position at a time with libm's `expf`; the V accumulator in f16,
/// rescaled and fused-multiply-added (then rounded) per position; the sum `S = fma(S, ms, vs)`.
/// Decode and short prompts go through this, so their tokens are llama.cpp's bit for bit.
fn attend_group_f16_ggml(
    qg: &[f32],
    rows: &Rows,
    span: &Span,
    scale: f32,
    out: &mut [f32],
    single: bool,
) {
    let d = rows.head_dim;
    // A lone query past 256 cached positions: llama.cpp splits the (256-padded) range in two
    // halves (one per thread of the 2-thread runs the references come from), then merges.
    let padded = span.n_pos.next_multiple_of(256);
    if single && padded >= 512 {
        let half = padded / 2;
        let lo = Span {
            n_pos: half.min(span.n_pos),
            ..*span
        };
        let hi = Span {
            first: half,
            ..*span
        };
        let a = ggml_partial(qg, rows, &lo, scale);
        let b = ggml_partial(qg, rows, &hi, scale);
        for h in 0..qg.len() / d {
            let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
            let dst = &mut out[h * d..(h + 1) * d];
            dst.fill(0.0);
            for part in [&a, &b] {
                if part.sum[h] == 0.0 {
                    continue;
                }
                let m_new = m.max(part.max[h]);
                let (so, sn) = ((m - m_new).exp(), (part.max[h] - m_new).exp());
                for (o, &x) in dst.iter_mut().zip(&part.acc[h * d..(h + 1) * d]) {
                    *o = o.mul_add(so, x * sn);
                }
                s = s.mul_add(so, part.sum[h] * sn);
                m = m_new;
            }
            if s != 0.0 {
                let inv = 1.0 / s;
                dst.iter_mut().for_each(|o| *o *= inv);
            }
        }
        return;
    }
    let p = ggml_partial(qg, rows, span, scale);
    write_normalized(out, &p.acc, &p.sum, d);
}

/// `out[h] = acc[h] / sum[h]` per head (`d` values each); 0 where nothing was attended.
fn write_normalized(out: &mut [f32], acc: &[f32], sum: &[f32], d: usize) {
    for ((o, a), &s) in out.chunks_exact_mut(d).zip(acc.chunks_exact(d)).zip(sum) {
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        for (o, x) in o.iter_mut().zip(a) {
            *o = x * inv;
        }
    }
}

/// Decode attention's K/V prefetch: how many chunks of 16 positions ahead, and the hint
/// (0: T0, into L1; 1: T1, into L2). Measured with `examples/attention_decode` and cold K/V
/// (BENCHMARKS.md, tenth session): on the AMD EPYC VM, T1 took 10.4–11.5 ms per token against
/// 12.1–12.3 for T0 at any distance; on the Xeon, T1 two chunks ahead was no faster than T0
/// one chunk ahead (12.2 against 11.6–14.9 ms), so AMD gets (2, T1) and others keep (1, T0).
/// `KESTREL_KV_PREFETCH=DIST,HINT` overrides both.
fn kv_prefetch_tuning() -> (usize, u8) {
    static T: std::sync::OnceLock<(usize, u8)> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        let default = if kestrel_quant::cpu_is_amd() {
            (2, 1)
        } else {
            (1, 0)
        };
        let v = std::env::var("KESTREL_KV_PREFETCH").unwrap_or_default();
        let mut it = v.split(',').map(|s| s.trim().parse::<usize>().ok());
        let dist = it.next().flatten().unwrap_or(default.0);
        let hint = it.next().flatten().map_or(default.1, |h| h.min(1) as u8);
        (dist, hint)
    })
}

/// The unnormalized state of the online softmax over a span, per query head.
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    /// `[head][dim]`, f16-valued.
    acc: Vec<f32>,
}

fn ggml_partial(qg: &[f32], rows: &Rows, span: &Span, scale: f32) -> Partial {
    let n_q = qg.len() / rows.head_dim;
    let mut p = Partial {
        max: vec![f32::NEG_INFINITY; n_q],
        sum: vec![0f32; n_q],
        acc: vec![0f32; qg.len()],
    };
    #[cfg(target_arch = "x86_64")]
    if crate::vexp::has_avx512() && has_f16c() {
        // SAFETY: AVX-512 F, FMA and F16C are available.
        unsafe { attend_ggml_avx512(qg, rows, span, scale, &mut p) };
        return p;
    }
    attend_ggml_body(qg, rows, span, scale, &mut p);
    p
}

/// The AVX-512 form of [`attend_ggml_body`]: the same operations per (position, head), done a
/// KV block (up to 16 positions) at a time: the block's 16-lane partial dots for every head,
/// then per head one exact 16-way horizontal reduction, the online-softmax decisions of the 16
/// positions, their `expf`s in one vector ([`crate::libm_exp`], libm's bits) and the f16
/// accumulator walked through the positions in registers. head_dim 64, 128 or 256 (others
/// take the portable body).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn attend_ggml_avx512(qg: &[f32], rows: &Rows, span: &Span, scale: f32, out: &mut Partial) {
    let n_q = qg.len() / rows.head_dim;
    match rows.head_dim {
        _ if n_q > 16 => attend_ggml_body(qg, rows, span, scale, out),
        64 => attend_ggml_blocks::<4>(qg, rows, span, scale, out),
        128 => attend_ggml_blocks::<8>(qg, rows, span, scale, out),
        256 => attend_ggml_blocks::<16>(qg, rows, span, scale, out),
        _ => attend_ggml_body(qg, rows, span, scale, out),
    }
}

/// [`attend_ggml_avx512`] for head_dim `16 * NV`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // register arrays indexed in lockstep
unsafe fn attend_ggml_blocks<const NV: usize>(
    qg: &[f32],
    rows: &Rows,
    span: &Span,
    scale: f32,
    out: &mut Partial,
) {
    use std::arch::x86_64::*;
    let d = 16 * NV;
    let n_q = qg.len() / d;
    let exact_exp = crate::libm_exp::matches_libm();
    let round = |x: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    let mut q16 = [[_mm512_setzero_ps(); NV]; 16];
    for h in 0..n_q {
        for j in 0..NV {
            q16[h][j] = round(_mm512_loadu_ps(qg.as_ptr().add(h * d + 16 * j)));
        }
    }
    // Per block: [head][position] partial dots (16 lanes each), the V rows as f32.
    let mut partial = [[_mm512_setzero_ps(); 16]; 16];
    let mut vrows = [[_mm512_setzero_ps(); NV]; 16];
    let mut exps = [[0f32; 16]; 16];
    let mut new_maxes = [0u32; 16];
    let (dist, hint) = kv_prefetch_tuning();
    // `ahead`: the first row and count of the chunk `dist` chunks on, to prefetch.
    let mut block = |row0: usize, n: usize, ahead_row: usize, ahead: usize| {
        let (k_run, v_run) = rows.run(row0, n);
        let (k_next, v_next) = rows.run(ahead_row, ahead);
        for p in 0..n {
            let kp = k_run.as_ptr().add(p * d) as *const __m256i;
            let vp = v_run.as_ptr().add(p * d) as *const __m256i;
            if p < ahead {
                let (kn, vn) = (k_next.as_ptr().add(p * d), v_next.as_ptr().add(p * d));
                for line in (0..d).step_by(32) {
                    if hint == 1 {
                        _mm_prefetch::<_MM_HINT_T1>(kn.add(line) as *const i8);
                        _mm_prefetch::<_MM_HINT_T1>(vn.add(line) as *const i8);
                    } else {
                        _mm_prefetch::<_MM_HINT_T0>(kn.add(line) as *const i8);
                        _mm_prefetch::<_MM_HINT_T0>(vn.add(line) as *const i8);
                    }
                }
            }
            let mut k = [_mm512_setzero_ps(); NV];
            for j in 0..NV {
                k[j] = _mm512_cvtph_ps(_mm256_loadu_si256(kp.add(j)));
                vrows[p][j] = _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(j)));
            }
            for h in 0..n_q {
                // ggml_vec_dot_f16: 4 accumulators over 64-element steps.
                let mut a = [_mm512_setzero_ps(); 4];
                for j in 0..NV {
                    a[j % 4] = _mm512_fmadd_ps(k[j], q16[h][j], a[j % 4]);
                }
                partial[h][p] = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
            }
        }
        for h in 0..n_q {
            let dots = reduce_add_16_rows(&partial[h]);
            let s = _mm512_add_ps(
                _mm512_mul_ps(dots, _mm512_set1_ps(scale)),
                _mm512_setzero_ps(),
            );
            let mut score = [0f32; 16];
            _mm512_storeu_ps(score.as_mut_ptr(), s);
            // The online softmax's decisions: a new max rescales by exp(old - new) (vs = 1),
            // any other position weighs exp(s - max) (ms = 1).
            let mut arg = [0f32; 16];
            let mut new_max = 0u32;
            let mut m = out.max[h];
            for p in 0..n {
                if score[p] > m {
                    arg[p] = m - score[p];
                    new_max |= 1 << p;
                    m = score[p];
                } else {
                    arg[p] = score[p] - m;
                }
            }
            out.max[h] = m;
            let mut e = [0f32; 16];
            if exact_exp {
                _mm512_storeu_ps(
                    e.as_mut_ptr(),
                    crate::libm_exp::expf16(_mm512_loadu_ps(arg.as_ptr())),
                );
            } else {
                for p in 0..n {
                    e[p] = arg[p].exp();
                }
            }
            exps[h] = e;
            new_maxes[h] = new_max;
        }
        // The f16 accumulators, two heads at a time (twice the independent chains to hide
        // the FMA -> f16 -> f32 latency of each step).
        let mut h = 0;
        while h < n_q {
            let pair = (n_q - h).min(2);
            let acc_base = out.acc.as_mut_ptr();
            let acc_at = |i: usize| acc_base.add((h + i) * d);
            if pair == 2 {
                let (a, b) = (acc_at(0), acc_at(1));
                accumulate_v::<NV, 2>(
                    [a, b],
                    &mut out.sum[h..h + 2],
                    &exps[h..h + 2],
                    &new_maxes[h..h + 2],
                    &vrows,
                    n,
                );
            } else {
                accumulate_v::<NV, 1>(
                    [acc_at(0)],
                    &mut out.sum[h..h + 1],
                    &exps[h..h + 1],
                    &new_maxes[h..h + 1],
                    &vrows,
                    n,
                );
            }
            h += pair;
        }
    };
    span.for_each_chunk16(|pos, row0, n| {
        let at = pos + 16 * dist;
        match span.row_of(at) {
            Some(r) => block(row0, n, r, (span.n_pos - at).min(16)),
            None => block(row0, n, row0, 0),
        }
    });
}

/// Walks `H` heads' f16 accumulators (`acc[i]`: head_dim = 16 * NV floats) and sums through
/// `n` positions: a new max rescales (`acc = f16(acc * e)`, ms = e, vs = 1), then
/// `acc = f16(fma(v, vs, acc))` and `sum = fma(sum, ms, vs)`, llama.cpp's steps in its order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::needless_range_loop)] // register arrays indexed in lockstep
unsafe fn accumulate_v<const NV: usize, const H: usize>(
    acc: [*mut f32; H],
    sum: &mut [f32],
    exps: &[[f32; 16]],
    new_max: &[u32],
    vrows: &[[std::arch::x86_64::__m512; NV]; 16],
    n: usize,
) {
    use std::arch::x86_64::*;
    let round = |x: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    let mut a = [[_mm512_setzero_ps(); NV]; H];
    for i in 0..H {
        for j in 0..NV {
            a[i][j] = _mm512_loadu_ps(acc[i].add(16 * j));
        }
    }
    for p in 0..n {
        for i in 0..H {
            let e = exps[i][p];
            let (ms, vs) = if new_max[i] & (1 << p) != 0 {
                let m = _mm512_set1_ps(e);
                for j in 0..NV {
                    a[i][j] = round(_mm512_mul_ps(a[i][j], m));
                }
                (e, 1.0)
            } else {
                (1.0, e)
            };
            let w = _mm512_set1_ps(vs);
            for j in 0..NV {
                a[i][j] = round(_mm512_fmadd_ps(vrows[p][j], w, a[i][j]));
            }
            sum[i] = sum[i].mul_add(ms, vs);
        }
    }
    for i in 0..H {
        for j in 0..NV {
            _mm512_storeu_ps(acc[i].add(16 * j), a[i][j]);
        }
    }
}

/// `_mm512_reduce_add_ps` of 16 vectors at once, in GCC's order for each (halves, quarters,
/// pairs, then the last two): lane `p` of the result is the reduction of `x[p]`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce_add_16_rows(x: &[std::arch::x86_64::__m512; 16]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // Halves: y[i] = [lanes 0..8 + lanes 8..16 of x[2i] | the same of x[2i+1]].
    let mut y = [_mm512_setzero_ps(); 8];
    for i in 0..8 {
        let (a, b) = (x[2 * i], x[2 * i + 1]);
        y[i] = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        );
    }
    // Quarters: z[i] holds rows 4i..4i+4, one 128-bit block (4 lanes) each.
    let mut z = [_mm512_setzero_ps(); 4];
    for i in 0..4 {
        let (a, b) = (y[2 * i], y[2 * i + 1]);
        z[i] = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        );
    }
    // Pairs: lanes 0 + 2 and 1 + 3 of each block; w[i] block c = rows (8i + c, 8i + 4 + c).
    let mut w = [_mm512_setzero_ps(); 2];
    for i in 0..2 {
        let (a, b) = (z[2 * i], z[2 * i + 1]);
        w[i] = _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
        );
    }
    // The last two: lane 4c + k holds row 4k + c; put row p in lane p.
    let r = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(w[0], w[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(w[0], w[1]),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, r)
}

/// `ggml_vec_dot_f16` as compiled for AVX-512 (F32 lanes): the result before rounding to f32.
#[inline(always)]
fn dot_f16_ggml(k: &[f32], q: &[f32]) -> f32 {
    let n = k.len();
    let np = n - n % 64;
    let mut acc = [[0f32; 16]; 4];
    for base in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, a) in a.iter_mut().enumerate() {
                let i = base + 16 * j + l;
                *a = k[i].mul_add(q[i], *a);
            }
        }
    }
    let mut x = [0f32; 16];
    for l in 0..16 {
        x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut t3 = [0f32; 8];
    for i in 0..8 {
        t3[i] = x[8 + i] + x[i];
    }
    let t6 = [t3[4] + t3[0], t3[5] + t3[1], t3[6] + t3[2], t3[7] + t3[3]];
    let mut sum = ((t6[0] + t6[2]) + (t6[1] + t6[3])) as f64;
    for i in np..n {
        sum += (k[i] * q[i]) as f64;
    }
    sum as f32
}

#[inline(always)]
fn attend_ggml_body(qg: &[f32], rows: &Rows, span: &Span, scale: f32, out: &mut Partial) {
    let d = rows.head_dim;
    let n_q = qg.len() / d;
    let q16: Vec<f32> = qg.iter().map(|x| round_f16(*x)).collect();
    // Per query head: running max, sum, and the f16-valued accumulator.
    let mut max = vec![f32::NEG_INFINITY; n_q];
    let mut sum = vec![0f32; n_q];
    let mut acc = vec![0f32; n_q * d];
    let mut k = vec![0f32; d];
    let mut v = vec![0f32; d];
    span.for_each_row(|row| {
        for (o, x) in k.iter_mut().zip(rows.k(row)) {
            *o = x.to_f32();
        }
        for (o, x) in v.iter_mut().zip(rows.v(row)) {
            *o = x.to_f32();
        }
        for h in 0..n_q {
            let s = dot_f16_ggml(&k, &q16[h * d..(h + 1) * d]) * scale + 0.0;
            let a = &mut acc[h * d..(h + 1) * d];
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > max[h] {
                ms = (max[h] - s).exp();
                max[h] = s;
                a.iter_mut().for_each(|x| *x = round_f16(*x * ms));
            } else {
                vs = (s - max[h]).exp();
            }
            for (x, &vv) in a.iter_mut().zip(&v) {
                *x = round_f16(vv.mul_add(vs, *x));
            }
            sum[h] = sum[h].mul_add(ms, vs);
        }
    });
    out.max = max;
    out.sum = sum;
    out.acc = acc;
}

/// Rounds to the nearest f16 and back: what storing into an f16 accumulator does.
#[inline]
fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// The plain version of the f16-cache attention, one position at a time: the SIMD one's oracle.
fn attend_group_f16_scalar(qg: &[f32], rows: &Rows, span: &Span, scale: f32, out: &mut [f32]) {
    let d = rows.head_dim;
    for (qh, dst) in qg.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let q16: Vec<f32> = qh.iter().map(|x| round_f16(*x)).collect();
        let mut acc = vec![0f32; d];
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
        span.for_each_row(|row| {
            let s = q16
                .iter()
                .zip(rows.k(row))
                .map(|(a, b)| a * b.to_f32())
                .sum::<f32>()
                * scale;
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > max {
                ms = (max - s).exp();
                max = s;
                acc.iter_mut().for_each(|a| *a = round_f16(*a * ms));
            } else {
                vs = (s - max).exp();
            }
            for (a, b) in acc.iter_mut().zip(rows.v(row)) {
                *a = round_f16(*a + b.to_f32() * vs);
            }
            sum = sum * ms + vs;
        });
        for (o, a) in dst.iter_mut().zip(&acc) {
            *o = a / sum;
        }
    }
}

/// f32 cache: plain f32 arithmetic throughout (used for parity with float64 references).
#[allow(clippy::too_many_arguments)]
fn attend_group_f32(
    kv: &KvPool,
    layer: usize,
    kvh: usize,
    qg: &[f32],
    d: usize,
    span: &Span,
    scale: f32,
    out: &mut [f32],
) {
    let mut k = vec![0f32; d];
    let mut v = vec![0f32; d];
    for (qh, dst) in qg.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mut acc = vec![0f32; d];
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
        span.for_each_row(|row| {
            kv.read_k(layer, row, kvh, &mut k);
            let s = qh.iter().zip(&k).map(|(a, b)| a * b).sum::<f32>() * scale;
            if s > max {
                // Rescale what was accumulated under the old maximum.
                let c = (max - s).exp();
                sum *= c;
                acc.iter_mut().for_each(|a| *a *= c);
                max = s;
            }
            let w = (s - max).exp();
            sum += w;
            kv.read_v(layer, row, kvh, &mut v);
            for (a, b) in acc.iter_mut().zip(&v) {
                *a += w * b;
            }
        });
        for (d, a) in dst.iter_mut().zip(&acc) {
            *d = a / sum;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
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
    pub unsafe fn attend_group_f16(
        qg: &[f32],
        rows: &Rows,
        span: &Span,
        scale: f32,
        out: &mut [f32],
    ) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD kernel against the scalar oracle on random data of several shapes.
    #[test]
    fn simd_attention_matches_scalar() {
        let mut seed = 0x2545F4914F6CDD1Du64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for (group, d, n_pos, n_kv) in [
            (1usize, 8usize, 1usize, 1usize),
            (7, 64, 37, 2),
            (3, 16, 300, 3),
            (2, 128, 65, 1),
        ] {
            let kv_dim = n_kv * d;
            let k: Vec<f16> = (0..n_pos * kv_dim)
                .map(|_| f16::from_f32(rnd() * 3.0))
                .collect();
            let v: Vec<f16> = (0..n_pos * kv_dim).map(|_| f16::from_f32(rnd())).collect();
            let q: Vec<f32> = (0..group * d).map(|_| rnd() * 2.0).collect();
            // A shuffled block table of 8-row blocks covering n_pos rows.
            let n_blocks = n_pos.div_ceil(8);
            let mut blocks: Vec<u32> = (0..n_blocks as u32).collect();
            blocks.reverse();
            let k: Vec<f16> = (0..n_blocks * 8 * kv_dim)
                .map(|i| k.get(i).copied().unwrap_or(f16::ZERO))
                .collect();
            let v: Vec<f16> = (0..n_blocks * 8 * kv_dim)
                .map(|i| v.get(i).copied().unwrap_or(f16::ZERO))
                .collect();
            let rows = Rows {
                k: &k,
                v: &v,
                kv_dim,
                kv_head: n_kv - 1,
                head_dim: d,
                block_size: 8,
            };
            let span = Span {
                blocks: &blocks,
                block_size: 8,
                n_pos,
                first: 0,
            };
            let mut want = vec![0f32; group * d];
            attend_group_f16_scalar(&q, &rows, &span, 0.125, &mut want);
            let mut got = vec![0f32; group * d];
            attend_group_f16(&q, &rows, &span, 0.125, &mut got);
            let err = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                err < 2e-3,
                "group {group} d {d} n_pos {n_pos}: max error {err}"
            );
        }
    }

    /// llama.cpp's one-query kernel (with and without the two-way split past 256 positions)
    /// and its tiled kernel: near the scalar oracle, and the AVX-512 forms equal the portable
    /// bodies bit for bit.
    #[test]
    fn ggml_order_kernels_match_the_oracle_and_their_portable_forms() {
        let mut seed = 0x9E3779B97F4A7C15u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let (group, d, n_pos, n_kv, bs) = (3usize, 64usize, 600usize, 2usize, 16usize);
        let kv_dim = n_kv * d;
        let n_blocks = n_pos.div_ceil(bs);
        let mut blocks: Vec<u32> = (0..n_blocks as u32).collect();
        blocks.reverse();
        let k: Vec<f16> = (0..n_blocks * bs * kv_dim)
            .map(|_| f16::from_f32(rnd() * 2.0))
            .collect();
        let v: Vec<f16> = (0..n_blocks * bs * kv_dim)
            .map(|_| f16::from_f32(rnd()))
            .collect();
        let rows = Rows {
            k: &k,
            v: &v,
            kv_dim,
            kv_head: 1,
            head_dim: d,
            block_size: bs,
        };
        let scale = 0.125;
        // One query at the last position: split (single) and unsplit.
        let q: Vec<f32> = (0..group * d).map(|_| rnd() * 2.0).collect();
        let span = Span {
            blocks: &blocks,
            block_size: bs,
            n_pos,
            first: 0,
        };
        let mut want = vec![0f32; group * d];
        attend_group_f16_scalar(&q, &rows, &span, scale, &mut want);
        for single in [false, true] {
            let mut got = vec![0f32; group * d];
            attend_group_f16_ggml(&q, &rows, &span, scale, &mut got, single);
            let err = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 5e-3, "one-query (single {single}): max error {err}");
        }
        // The block-at-a-time SIMD form equals the portable body bit for bit: head_dim 64 and
        // 128, groups of 3 and 7, whole spans and the upper half of a split one (first > 0,
        // not on a block boundary).
        for (d, group, first) in [(64, 3, 0), (64, 3, 300), (128, 7, 0), (128, 7, 259)] {
            let kv_dim = n_kv * d;
            let k: Vec<f16> = (0..n_blocks * bs * kv_dim)
                .map(|_| f16::from_f32(rnd() * 2.0))
                .collect();
            let v: Vec<f16> = (0..n_blocks * bs * kv_dim)
                .map(|_| f16::from_f32(rnd()))
                .collect();
            let rows = Rows {
                k: &k,
                v: &v,
                kv_dim,
                kv_head: 1,
                head_dim: d,
                block_size: bs,
            };
            let q: Vec<f32> = (0..group * d).map(|_| rnd() * 4.0).collect();
            let span = Span { first, ..span };
            let mut portable = Partial {
                max: vec![0.0; group],
                sum: vec![0.0; group],
                acc: vec![0.0; group * d],
            };
            attend_ggml_body(&q, &rows, &span, scale, &mut portable);
            let simd = ggml_partial(&q, &rows, &span, scale);
            assert_eq!(portable.acc, simd.acc, "d {d} group {group} first {first}");
            assert_eq!(portable.sum, simd.sum);
            assert_eq!(portable.max, simd.max);
        }

        // A tile of 70 queries at positions 500..570 (two tiles of 64 + 6 in the engine).
        let nq = 64;
        let positions: Vec<usize> = (500..500 + nq).collect();
        let toks: Vec<TokenKv> = positions
            .iter()
            .map(|&pos| TokenKv {
                tiled: false,
                pos,
                blocks: &blocks,
            })
            .collect();
        let q_dim = 2 * group * d;
        let qs: Vec<f32> = (0..nq * q_dim).map(|_| rnd() * 2.0).collect();
        let tile = QueryTile {
            tokens: &toks,
            q: &qs,
            q_off: group * d,
            q_dim,
            group,
            block_size: bs,
        };
        let mut out_simd = vec![0f32; nq * q_dim];
        let mut out_body = vec![0f32; nq * q_dim];
        {
            let ptr = SharedMut::new(&mut out_simd);
            // SAFETY: each query's slice is distinct.
            attend_tile_ggml(&tile, &rows, scale, |i| unsafe {
                ptr.slice(i * q_dim + group * d, group * d)
            });
            let ptr = SharedMut::new(&mut out_body);
            // SAFETY: as above.
            attend_tile_body(&tile, &rows, scale, &|i| unsafe {
                ptr.slice(i * q_dim + group * d, group * d)
            });
        }
        assert_eq!(out_simd, out_body);
        for (i, &pos) in positions.iter().enumerate() {
            let span = Span {
                blocks: &blocks,
                block_size: bs,
                n_pos: pos + 1,
                first: 0,
            };
            let qg = &qs[i * q_dim + group * d..][..group * d];
            let mut want = vec![0f32; group * d];
            attend_group_f16_scalar(qg, &rows, &span, scale, &mut want);
            let got = &out_simd[i * q_dim + group * d..][..group * d];
            let err = want
                .iter()
                .zip(got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 5e-3, "tiled, query {i}: max error {err}");
        }
    }
}
