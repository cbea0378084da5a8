//! Causal grouped-query attention over the KV cache, one pass with an online softmax
//! (FlashAttention's recurrence): scratch per (token, head) is O(head_dim), never O(context²).

use crate::kv::KvCache;
use crate::pool::{SharedMut, ThreadPool};

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
