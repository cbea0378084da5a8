//! Decode attention at depth, alone: one query token against `depth` cached positions in every
//! layer of a model-shaped f16 KV pool (random contents), through the engine's
//! `causal_attention`. Prints the fastest token's milliseconds (all layers) and the K/V read rate.
//!
//! `cargo run --release -p kestrel-models --example attention_decode -- [depth] [layers]
//! [heads] [kv_heads] [head_dim] [threads] [block_size]` (default: the 1.5B model's shape at
//! depth 4096, blocks of 16 positions as the server's pool; `kestrel run/bench` use 64).
//! With `KESTREL_COLD=MIB`, each layer's attention follows a read of MIB fresh MiB (default
//! off; 33 is one 1.5B layer's weights), as in the model, where the weights' stream evicts the
//! K/V between tokens: the printed time is then the attention's alone, with cold K/V.

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
        tiled: false,
    }];
    let cold_mib: usize = std::env::var("KESTREL_COLD")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // Layer slices of a buffer larger than any cache, each read before its layer's attention.
    let evict = vec![1u8; (cold_mib << 20) * layers.max(1)];
    let read_slice = |layer: usize| {
        let slice = &evict[(cold_mib << 20) * layer..(cold_mib << 20) * (layer + 1)];
        let sums: Vec<std::sync::atomic::AtomicU64> = (0..threads)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect();
        let part = slice.len().div_ceil(threads.max(1)).max(1);
        pool.run(threads, &|i| {
            let s: u64 = slice
                .chunks(part)
                .nth(i)
                .unwrap_or(&[])
                .iter()
                .step_by(64)
                .map(|&b| b as u64)
                .sum();
            sums[i].store(s, std::sync::atomic::Ordering::Relaxed);
        });
        std::hint::black_box(sums);
    };
    // Seconds of attention (all layers) for one token.
    let step = |out: &mut [f32]| {
        let mut t = 0.0;
        for layer in 0..layers {
            if cold_mib > 0 {
                read_slice(layer);
            }
            let start = Instant::now();
            causal_attention(
                &pool, &kv, layer, &q, &tokens, heads, kv_heads, head_dim, out,
            );
            t += start.elapsed().as_secs_f64();
        }
        t
    };
    step(&mut out);
    // The fastest of 20 tokens: the machine's neighbours only ever add time.
    let per_token = (0..20)
        .map(|_| step(&mut out))
        .fold(f64::INFINITY, f64::min);
    let bytes = 2.0 * layers as f64 * (depth + 1) as f64 * kv_dim as f64 * 2.0;
    println!(
        "depth {depth}, {layers} layers, {heads}/{kv_heads} heads x {head_dim}, {threads} threads: \
         {:.2} ms per token{}, K/V read {:.1} GB/s (checksum {:.4}; vector expf = libm's: {})",
        per_token * 1e3,
        if cold_mib > 0 { format!(" (K/V cold: {cold_mib} MiB read before each layer)") } else { String::new() },
        bytes / per_token / 1e9,
        out.iter().sum::<f32>(),
        kestrel_models::libm_exp::matches_libm()
    );
}
