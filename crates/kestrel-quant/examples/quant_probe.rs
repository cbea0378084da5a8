//! Activation quantization before a decode matmul, alone: microseconds per row for the rows
//! the Qwen2.5 models quantize per token (Q8_K for K-quant matrices, Q8_0 for Q5_0/Q8_0 ones).
//! One thread; the row stays in L1, so this is the arithmetic alone.
//!
//! cargo run --release -p kestrel-quant --example quant_probe
use kestrel_quant::{quantize_activation_row, row_bytes, GgmlType};
use std::time::Instant;

fn main() -> Result<(), kestrel_quant::QuantError> {
    let rows = [
        (GgmlType::Q8_K, 1536), // 1.5B: q/k/v, attn_output, gate/up, output
        (GgmlType::Q8_K, 8960), // 1.5B: ffn_down
        (GgmlType::Q8_0, 896),  // 0.5B: q/k/v, attn_output, gate/up, output
        (GgmlType::Q8_K, 4864), // 0.5B: ffn_down
    ];
    for (ty, n) in rows {
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 300.0 - 1.6)
            .collect();
        let mut out = vec![0u8; row_bytes(ty, n)?];
        let reps = 20_000;
        let t = Instant::now();
        for _ in 0..reps {
            quantize_activation_row(ty, std::hint::black_box(&x), &mut out)?;
        }
        let us = t.elapsed().as_secs_f64() / reps as f64 * 1e6;
        println!("{ty:?} x {n}: {us:.2} us per row");
    }
    Ok(())
}
