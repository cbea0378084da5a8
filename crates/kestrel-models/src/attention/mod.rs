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

mod ggml;
#[cfg(test)]
mod tests;
mod tile;
#[cfg(target_arch = "x86_64")]
mod x86;

use ggml::attend_group_f16_ggml;
use tile::{attend_tile_ggml, QueryTile};

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

/// Whether the AVX2 + FMA + F16C kernels run here (within the process's ISA cap).
#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    crate::vexp::has_avx2()
}

/// Query rows from which llama.cpp's CPU flash attention switches to its tiled kernel.
const GGML_TILE_Q: usize = 64;

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
