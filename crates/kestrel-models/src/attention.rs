//! Causal grouped-query attention over the KV cache, one pass with an online softmax
//! (FlashAttention's recurrence): scratch per (token, head) is O(head_dim), never O(context²).

use crate::kv::KvCache;
use crate::pool::{SharedMut, ThreadPool};
use half::f16;

/// `out[t, h, :] = softmax(q[t,h] · K[0..=start+t, h/group]ᵀ / sqrt(d)) · V[...]`
///
/// `q` and `out` are `[T, n_heads * head_dim]`; the cache already holds positions
/// `0..start+T` of `layer`.
#[allow(clippy::too_many_arguments)]
pub fn causal_attention(
    pool: &ThreadPool,
    cache: &KvCache,
    layer: usize,
    q: &[f32],
    start: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    out: &mut [f32],
) {
    let q_dim = n_heads * head_dim;
    let t_len = q.len() / q_dim;
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let out_ptr = SharedMut::new(out);
    if let Some((k16, v16)) = cache.f16_layer(layer) {
        let kv_dim = cache.kv_dim();
        pool.run(t_len * n_heads, &|task| {
            let (t, h) = (task / n_heads, task % n_heads);
            let qh = &q[t * q_dim + h * head_dim..t * q_dim + (h + 1) * head_dim];
            // SAFETY: each (t, h) slot is written by exactly one task.
            let dst = unsafe { out_ptr.slice(t * q_dim + h * head_dim, head_dim) };
            attend_f16(qh, k16, v16, kv_dim, (h / group) * head_dim, start + t + 1, scale, dst);
        });
        return;
    }
    pool.run(t_len * n_heads, &|task| {
        let (t, h) = (task / n_heads, task % n_heads);
        let qh = &q[t * q_dim + h * head_dim..t * q_dim + (h + 1) * head_dim];
        let kvh = h / group;
        let mut k = vec![0f32; head_dim];
        let mut v = vec![0f32; head_dim];
        let mut acc = vec![0f32; head_dim];
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
        for pos in 0..=start + t {
            cache.read_k(layer, pos, kvh, &mut k);
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
            cache.read_v(layer, pos, kvh, &mut v);
            for (a, b) in acc.iter_mut().zip(&v) {
                *a += w * b;
            }
        }
        // SAFETY: each (t, h) slot is written by exactly one task.
        let dst = unsafe { out_ptr.slice(t * q_dim + h * head_dim, head_dim) };
        for (d, a) in dst.iter_mut().zip(&acc) {
            *d = a / sum;
        }
    });
}

/// One query head against f16 K/V with ggml's CPU flash-attention numerics: q rounded to f16,
/// f32 dot products, V accumulated in f16. Matching those roundings keeps greedy tokens equal
/// to llama.cpp's on models whose logits sit near ties.
#[allow(clippy::too_many_arguments)]
fn attend_f16(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    kv_dim: usize,
    head_off: usize,
    n_pos: usize,
    scale: f32,
    out: &mut [f32],
) {
    let d = q.len();
    let q16: Vec<f32> = q.iter().map(|x| f16::from_f32(*x).to_f32()).collect();
    let mut acc = vec![f16::ZERO; d];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    for pos in 0..n_pos {
        let kr = &k[pos * kv_dim + head_off..pos * kv_dim + head_off + d];
        let s = q16.iter().zip(kr).map(|(a, b)| a * b.to_f32()).sum::<f32>() * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > max {
            ms = (max - s).exp();
            max = s;
            for a in acc.iter_mut() {
                *a = f16::from_f32(a.to_f32() * ms);
            }
        } else {
            vs = (s - max).exp();
        }
        let vr = &v[pos * kv_dim + head_off..pos * kv_dim + head_off + d];
        for (a, b) in acc.iter_mut().zip(vr) {
            *a = f16::from_f32(a.to_f32() + b.to_f32() * vs);
        }
        sum = sum * ms + vs;
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = a.to_f32() / sum;
    }
}
