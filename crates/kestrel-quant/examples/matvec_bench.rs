//! Single-thread matvec bandwidth: a 8960 x 1536 weight matrix (Qwen2.5-1.5B's ffn_up/gate
//! shape) against one quantized activation row, per backend, in GB/s of weight bytes read.
//! Napkin limit: one core streams about 10 GB/s from DRAM here, so a bandwidth-bound kernel
//! tops out near that "cold"; "hot" (one 7.7 MB matrix, resident in the 32 MB L3) shows the
//! compute ceiling. Also prints the batched form (8 activation rows per weight row).
//!
//! cargo run -p kestrel-quant --release --example matvec_bench

use kestrel_quant::{quantize_row, row_bytes, vec_dot_multi_with, vec_dot_type, Backend, GgmlType};
use std::time::Instant;

const ROWS: usize = 8960;
const N: usize = 1536;
/// Copies cycled for the "cold" figure: 8 x 7.7 MB (Q4_K) exceeds the L3.
const COPIES: usize = 8;

fn main() -> Result<(), kestrel_quant::QuantError> {
    let mut seed = 0x1234_5678u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    for w in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let rb = row_bytes(w, N)?;
        let row: Vec<f32> = (0..N).map(|_| rnd()).collect();
        let mut mats = Vec::new();
        for _ in 0..COPIES {
            let mut m = vec![0u8; rb * ROWS];
            for r in m.chunks_exact_mut(rb) {
                let x: Vec<f32> = row.iter().map(|v| v + rnd() * 0.1).collect();
                quantize_row(w, &x, r)?;
            }
            mats.push(m);
        }
        let a = vec_dot_type(w);
        let acts: Vec<Vec<u8>> = (0..8)
            .map(|_| {
                let x: Vec<f32> = (0..N).map(|_| rnd()).collect();
                let mut q = vec![0u8; row_bytes(a, N).unwrap_or(0)];
                quantize_row(a, &x, &mut q).map(|_| q)
            })
            .collect::<Result<_, _>>()?;
        let mb = (rb * ROWS) as f64 / 1e6;
        println!("{w}: {ROWS} x {N}, {mb:.1} MB per matrix");
        for b in Backend::available() {
            let run = |mats: &[Vec<u8>],
                       batch: usize,
                       reps: usize|
             -> Result<f64, kestrel_quant::QuantError> {
                let refs: Vec<&[u8]> = acts[..batch].iter().map(|v| v.as_slice()).collect();
                let mut out = vec![0f32; batch];
                let mut sink = 0f32;
                let t = Instant::now();
                for rep in 0..reps {
                    let m = &mats[rep % mats.len()];
                    for r in m.chunks_exact(rb) {
                        vec_dot_multi_with(b, w, N, r, &refs, &mut out)?;
                        sink += out[0];
                    }
                }
                std::hint::black_box(sink);
                Ok((rb * ROWS * reps) as f64 / t.elapsed().as_secs_f64() / 1e9)
            };
            let reps = if b == Backend::Generic { 2 } else { 16 };
            let hot = run(&mats[..1], 1, reps)?;
            let cold = run(&mats, 1, reps.max(COPIES))?;
            let batch8 = run(&mats, 8, reps.max(COPIES))?;
            println!(
                "  {b:<11?} matvec hot {hot:6.2} GB/s  cold {cold:6.2} GB/s  | batch 8: {batch8:6.2} GB/s of weights ({:6.2} GB/s token-equivalent)",
                batch8 * 8.0
            );
        }
    }
    Ok(())
}
