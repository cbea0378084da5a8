//! Rough per-token cost of the chain on a 152k vocabulary:
//! `cargo run --release -p kestrel-sampler --example bench_sample`.

use std::time::Instant;

use kestrel_sampler::{logprobs, Sampler, SamplingParams};

fn main() {
    let n = 151_936usize;
    let logits: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 % 10_007) as f32) / 1000.0)
        .collect();
    let history: Vec<u32> = (0..512).map(|i| (i * 31) % n as u32).collect();
    let configs = [
        ("default (top_k 40)", SamplingParams::default()),
        ("greedy", SamplingParams::greedy()),
        (
            "top_k 0, top_p 0.95",
            SamplingParams {
                top_k: 0,
                ..SamplingParams::default()
            },
        ),
        (
            "no truncation, penalties",
            SamplingParams {
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                repeat_penalty: 1.1,
                presence_penalty: 0.5,
                ..SamplingParams::default()
            },
        ),
    ];
    let iters = 200;
    for (name, p) in configs {
        let mut s = match Sampler::new(p.clone(), n) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{name}: {e}");
                continue;
            }
        };
        let t = Instant::now();
        let mut acc = 0u64;
        for _ in 0..iters {
            acc += u64::from(s.sample(&logits, &history));
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        println!("{name:28} {us:8.1} µs/token  (checksum {acc})");
    }
    let t = Instant::now();
    for _ in 0..iters {
        std::hint::black_box(logprobs(&logits, 20));
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!("{:28} {us:8.1} µs/call", "logprobs k=20");
}
