//! Decode attention at depth, alone: one query token against `depth` cached positions in every
//! layer of a model-shaped f16 KV pool (random contents), through the engine's
//! `causal_attention`. Prints the fastest token's milliseconds (all layers) and the K/V read rate.
//!
//! `cargo run --release -p kestrel-models --example attention_decode -- [depth] [layers]
//! [heads] [kv_heads] [head_dim] [threads] [block_size]` (default: the 1.5B model's shape at
//! depth 4096, blocks of 16 positions as the server's pool; `kestrel run/bench` use 64).

use kestrel_models::attention::{causal_attention, TokenKv};
use kestrel_models::kv::{KvPool, KvType};
use kestrel_models::pool::ThreadPool;
use std::time::Instant;

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let (depth, layers, heads, kv_heads, head_dim, threads) = (
        arg(1, 4096),
        arg(2, 28),
        arg(3, 12),
        arg(4, 2),
        arg(5, 128),
        arg(6, 2),
    );
    let block_size = arg(7, 16);
    let n_blocks = (depth + 1).div_ceil(block_size);
    let mut kv = KvPool::new(
        layers,
        kv_heads,
        head_dim,
        n_blocks,
        block_size,
        KvType::F16,
    );
    let kv_dim = kv_heads * head_dim;
    let mut seed = 0x9E3779B97F4A7C15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let mut k = vec![0f32; kv_dim];
    let mut v = vec![0f32; kv_dim];
    for layer in 0..layers {
        for row in 0..n_blocks * block_size {
            k.iter_mut().for_each(|x| *x = rnd() * 3.0);
            v.iter_mut().for_each(|x| *x = rnd());
            kv.write_row(layer, row, &k, &v);
        }
    }
    let blocks: Vec<u32> = (0..n_blocks as u32).collect();
    let pool = ThreadPool::new(threads);
    let q: Vec<f32> = (0..heads * head_dim).map(|_| rnd()).collect();
    let mut out = vec![0f32; heads * head_dim];
    let tokens = [TokenKv {
        pos: depth,
        blocks: &blocks,
    }];
    let step = |out: &mut [f32]| {
        for layer in 0..layers {
            causal_attention(
                &pool, &kv, layer, &q, &tokens, heads, kv_heads, head_dim, out,
            );
        }
    };
    step(&mut out);
    // The fastest of 20 tokens: the machine's neighbours only ever add time.
    let per_token = (0..20)
        .map(|_| {
            let t = Instant::now();
            step(&mut out);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    let bytes = 2.0 * layers as f64 * (depth + 1) as f64 * kv_dim as f64 * 2.0;
    println!(
        "depth {depth}, {layers} layers, {heads}/{kv_heads} heads x {head_dim}, {threads} threads: \
         {:.2} ms per token, K/V read {:.1} GB/s (checksum {:.4}; vector expf = libm's: {})",
        per_token * 1e3,
        bytes / per_token / 1e9,
        out.iter().sum::<f32>(),
        kestrel_models::libm_exp::matches_libm()
    );
}
