//! Prefill matmuls alone: random matrices of a model's shapes, repacked as at load, against a
//! batch of quantized activation rows, prepared once per matmul (one thread) and then groups of
//! 16 rows spread over threads as the engine does. Prints each shape's best time and
//! integer-op rate (2 x rows x cols x tokens).
//!
//! `cargo run --release -p kestrel-quant --example prefill_matmul -- [tokens] [threads] [type]`
//! (defaults: 512 tokens, 2 threads, q4_k; `q6_k`, `q8_0`, `q5_0` also). The shapes are one
//! layer of Qwen2.5-Coder-1.5B. `KESTREL_AMX=0` runs the VNNI kernels where AMX is present.

use kestrel_quant::repack::{Repacked, R};
use kestrel_quant::GgmlType;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let tokens: usize = arg(1).and_then(|s| s.parse().ok()).unwrap_or(512);
    let threads: usize = arg(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let ty = match arg(3).as_deref().unwrap_or("q4_k") {
        "q6_k" => GgmlType::Q6_K,
        "q8_0" => GgmlType::Q8_0,
        "q5_0" => GgmlType::Q5_0,
        _ => GgmlType::Q4_K,
    };
    if !Repacked::supports(ty, 16) {
        eprintln!("no repacked kernels on this CPU (they need AVX-512 VNNI)");
        std::process::exit(1);
    }
    println!(
        "{ty:?}, {tokens} tokens, {threads} threads, AMX {}",
        if kestrel_quant::amx::available() {
            "on"
        } else {
            "off"
        }
    );
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let mut total = 0f64;
    for (name, rows, cols) in [
        ("attn_q/o", 1536, 1536),
        ("attn_k/v", 256, 1536),
        ("ffn_gate/up", 8960, 1536),
        ("ffn_down", 1536, 8960),
    ] {
        let rb = kestrel_quant::row_bytes(ty, cols).expect("row size");
        let mut w = vec![0u8; rows * rb];
        let mut x = vec![0f32; cols];
        for dst in w.chunks_exact_mut(rb) {
            x.iter_mut().for_each(|v| *v = rnd());
            kestrel_quant::quantize_row(ty, &x, dst).expect("quantize");
        }
        let packed = Repacked::new(ty, &w, rows, cols).expect("repack");
        let act_ty = packed.act_type();
        let ab = kestrel_quant::row_bytes(act_ty, cols).expect("row size");
        let mut acts = vec![0u8; tokens * ab];
        for dst in acts.chunks_exact_mut(ab) {
            x.iter_mut().for_each(|v| *v = rnd() * 1.4);
            kestrel_quant::quantize_activation_row(act_ty, &x, dst).expect("quantize");
        }
        let act_rows: Vec<&[u8]> = acts.chunks_exact(ab).collect();
        let groups = rows / R;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let next = AtomicUsize::new(0);
            let start = Instant::now();
            // Timed too: it builds the AMX panel where AMX runs.
            let prepared = packed.prepare(&act_rows).expect("prepare");
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        let mut out = vec![0f32; tokens * R];
                        loop {
                            let g = next.fetch_add(1, Ordering::Relaxed);
                            if g >= groups {
                                break;
                            }
                            packed.dot_group(g, &prepared, &mut out).expect("dot");
                        }
                    });
                }
            });
            best = best.min(start.elapsed().as_secs_f64());
        }
        let ops = 2.0 * (rows * cols * tokens) as f64;
        println!(
            "{name:>12} {rows:>5} x {cols:>5}: {:8.2} ms  {:7.1} Gop/s",
            best * 1e3,
            ops / best / 1e9
        );
        let times = if name == "attn_k/v" || name == "attn_q/o" || name == "ffn_gate/up" {
            2.0
        } else {
            1.0
        };
        total += best * times;
    }
    println!(
        "one layer's matmuls: {:.2} ms, {:.0} tokens/s for 28 layers (matmuls only)",
        total * 1e3,
        tokens as f64 / (total * 28.0)
    );
}
