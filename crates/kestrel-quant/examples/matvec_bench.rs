//! Single-thread matvec bandwidth and batched (prefill) throughput, per weight type and backend.
//!
//! Decode: a 8960 x 1536 weight matrix (Qwen2.5-1.5B's ffn_up/gate shape) against one quantized
//! activation row, in GB/s of weight bytes read. Napkin limit: one core streams about 10 GB/s
//! from DRAM here, so a bandwidth-bound kernel tops out near that "cold" (8 copies cycled, more
//! than the 32 MB L3); "hot" (one matrix, L3-resident when it fits) shows the compute ceiling.
//!
//! Prefill: `T` activation rows per weight row through [`vec_dot_multi`] (one call per weight
//! row) and through [`vec_dot_rows`] (4 weight rows per call), and where the detected backend
//! repacks the type, through the repacked layout the model runs ("repacked"), in effective
//! GOPS (2 ops per multiply-add) and GB/s of weights.
//!
//! cargo run -p kestrel-quant --release --example matvec_bench -- [TYPES..] [--t 64,512]
//!   [--backend avx512|avx2|generic] [--no-decode] [--no-prefill]

use kestrel_quant::repack::Repacked;
use kestrel_quant::{
    quantize_row, row_bytes, vec_dot_multi_with, vec_dot_rows_with, vec_dot_type, Backend, GgmlType,
};

/// Thread CPU time: other builds share these 2 cores, and wall time would count their slices.
struct Instant(f64);
#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}
extern "C" {
    fn clock_gettime(clk: i32, ts: *mut Timespec) -> i32;
}
impl Instant {
    fn now() -> Instant {
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: CLOCK_THREAD_CPUTIME_ID (3) with a valid out pointer.
        unsafe { clock_gettime(3, &mut ts) };
        Instant(ts.sec as f64 + ts.nsec as f64 * 1e-9)
    }
    fn elapsed(&self) -> Elapsed {
        Elapsed(Instant::now().0 - self.0)
    }
}
struct Elapsed(f64);
impl Elapsed {
    fn as_secs_f64(&self) -> f64 {
        self.0
    }
}

const ROWS: usize = 8960;
const N: usize = 1536;
/// Copies cycled for the "cold" figure: 8 x 7.7 MB (Q4_K) exceeds the L3.
const COPIES: usize = 8;
/// Weight rows in the prefill measurement (a 1 MB-ish slice: the weights matter little there).
const PREFILL_ROWS: usize = 256;
/// Weight rows per `vec_dot_rows` call in the prefill measurement (the model's tiled matmul
/// hands over ~120 rows at a time for a 512-token batch).
const ROWS_PER_CALL: usize = 128;

fn parse_ty(s: &str) -> Option<GgmlType> {
    Some(match s.to_ascii_uppercase().as_str() {
        "Q4_0" => GgmlType::Q4_0,
        "Q4_1" => GgmlType::Q4_1,
        "Q5_0" => GgmlType::Q5_0,
        "Q5_1" => GgmlType::Q5_1,
        "Q8_0" => GgmlType::Q8_0,
        "Q2_K" => GgmlType::Q2_K,
        "Q3_K" => GgmlType::Q3_K,
        "Q4_K" => GgmlType::Q4_K,
        "Q5_K" => GgmlType::Q5_K,
        "Q6_K" => GgmlType::Q6_K,
        _ => return None,
    })
}

fn main() -> Result<(), kestrel_quant::QuantError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut types = Vec::new();
    let mut ts = vec![64usize, 512];
    let mut backends: Vec<Backend> = Backend::available();
    let (mut decode, mut prefill) = (true, true);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--t" => {
                i += 1;
                ts = args[i].split(',').filter_map(|v| v.parse().ok()).collect();
            }
            "--backend" => {
                i += 1;
                backends = vec![match args[i].as_str() {
                    "generic" => Backend::Generic,
                    "avx2" => Backend::Avx2,
                    _ => Backend::Avx512Vnni,
                }];
            }
            "--no-decode" => decode = false,
            "--no-prefill" => prefill = false,
            s => types.extend(parse_ty(s)),
        }
        i += 1;
    }
    if types.is_empty() {
        types = vec![
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ];
    }
    let mut seed = 0x1234_5678u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    for w in types {
        let rb = row_bytes(w, N)?;
        let row: Vec<f32> = (0..N).map(|_| rnd()).collect();
        let mut m0 = vec![0u8; rb * ROWS];
        for r in m0.chunks_exact_mut(rb) {
            let x: Vec<f32> = row.iter().map(|v| v + rnd() * 0.1).collect();
            quantize_row(w, &x, r)?;
        }
        // Distinct buffers (same bytes) so the cold loop streams from DRAM.
        let mats: Vec<Vec<u8>> = (0..COPIES).map(|_| m0.clone()).collect();
        let a = vec_dot_type(w);
        let tmax = ts.iter().copied().max().unwrap_or(1).max(1);
        let acts: Vec<Vec<u8>> = (0..tmax)
            .map(|_| {
                let x: Vec<f32> = (0..N).map(|_| rnd()).collect();
                let mut q = vec![0u8; row_bytes(a, N).unwrap_or(0)];
                quantize_row(a, &x, &mut q).map(|_| q)
            })
            .collect::<Result<_, _>>()?;
        let mb = (rb * ROWS) as f64 / 1e6;
        println!("{w}: {ROWS} x {N}, {mb:.1} MB per matrix");
        for &b in &backends {
            if decode {
                let run =
                    |mats: &[Vec<u8>], reps: usize| -> Result<f64, kestrel_quant::QuantError> {
                        let refs: Vec<&[u8]> = vec![acts[0].as_slice()];
                        let mut out = [0f32];
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
                let hot = run(&mats[..1], reps)?;
                let cold = run(&mats, reps.max(2 * COPIES))?;
                println!("  {b:<11?} decode  hot {hot:6.2} GB/s  cold {cold:6.2} GB/s");
                if b == Backend::detect() {
                    // `matvec`, the model's decode entry (the detected backend's kernels).
                    let run =
                        |mats: &[Vec<u8>], reps: usize| -> Result<f64, kestrel_quant::QuantError> {
                            let mut out = vec![0f32; ROWS];
                            let mut sink = 0f32;
                            let t = Instant::now();
                            for rep in 0..reps {
                                kestrel_quant::matvec(
                                    w,
                                    N,
                                    &mats[rep % mats.len()],
                                    &acts[0],
                                    &mut out,
                                )?;
                                sink += out[0];
                            }
                            std::hint::black_box(sink);
                            Ok((rb * ROWS * reps) as f64 / t.elapsed().as_secs_f64() / 1e9)
                        };
                    let hot = run(&mats[..1], 16)?;
                    let cold = run(&mats, 2 * COPIES)?;
                    println!(
                        "  {b:<11?} decode  hot {hot:6.2} GB/s  cold {cold:6.2} GB/s  (matvec)"
                    );
                }
                if Repacked::supports(w, ROWS) && b == Backend::detect() {
                    // The layout the model decodes K-quants from (16-row groups, repacked at load).
                    let packed: Vec<Repacked> = mats
                        .iter()
                        .map(|m| Repacked::new(w, m, ROWS, N))
                        .collect::<Result<_, _>>()?;
                    let run = |packs: &[Repacked],
                               reps: usize|
                     -> Result<f64, kestrel_quant::QuantError> {
                        let refs: Vec<&[u8]> = vec![acts[0].as_slice()];
                        let prepared = packs[0].prepare(&refs)?;
                        let mut out = [0f32; kestrel_quant::repack::R];
                        let mut sink = 0f32;
                        let t = Instant::now();
                        for rep in 0..reps {
                            let p = &packs[rep % packs.len()];
                            for g in 0..ROWS / kestrel_quant::repack::R {
                                p.dot_group(g, &prepared, &mut out)?;
                                sink += out[0];
                            }
                        }
                        std::hint::black_box(sink);
                        Ok((rb * ROWS * reps) as f64 / t.elapsed().as_secs_f64() / 1e9)
                    };
                    let hot = run(&packed[..1], 16)?;
                    let cold = run(&packed, 2 * COPIES)?;
                    println!(
                        "  {b:<11?} decode  hot {hot:6.2} GB/s  cold {cold:6.2} GB/s  (repacked)"
                    );
                }
            }
            if prefill && b != Backend::Generic {
                for &t_len in &ts {
                    let refs: Vec<&[u8]> = acts[..t_len].iter().map(|v| v.as_slice()).collect();
                    let mut out = vec![0f32; t_len];
                    let mut sink = 0f32;
                    let rows = PREFILL_ROWS;
                    let reps = (4096 / t_len).max(1);
                    let t = Instant::now();
                    for _ in 0..reps {
                        for r in m0.chunks_exact(rb).take(rows) {
                            vec_dot_multi_with(b, w, N, r, &refs, &mut out)?;
                            sink += out[t_len - 1];
                        }
                    }
                    let s = t.elapsed().as_secs_f64();
                    std::hint::black_box(sink);
                    let macs = (rows * N * t_len * reps) as f64;
                    // One line per form: effective GOPS and weight bytes read per second.
                    let line = |form: &str, s: f64| {
                        println!(
                            "  {b:<11?} prefill T={t_len:<4} {form:<6} {:7.1} GOPS ({:5.2} GB/s weights)",
                            2.0 * macs / s / 1e9,
                            (rb * rows * reps) as f64 / s / 1e9
                        )
                    };
                    line("multi:", s);
                    let mut out4 = vec![0f32; ROWS_PER_CALL * t_len];
                    let all: Vec<&[u8]> = m0.chunks_exact(rb).take(rows).collect();
                    let t = Instant::now();
                    for _ in 0..reps {
                        for w4 in all.chunks(ROWS_PER_CALL) {
                            vec_dot_rows_with(b, w, N, w4, &refs, &mut out4[..w4.len() * t_len])?;
                            sink += out4[t_len - 1];
                        }
                    }
                    let s = t.elapsed().as_secs_f64();
                    std::hint::black_box(sink);
                    line("rows:", s);
                    if Repacked::supports(w, rows) && b == Backend::detect() {
                        // The layout the model runs (16-row groups, repacked at load).
                        let packed = Repacked::new(w, &m0[..rb * rows], rows, N)?;
                        let prepared = packed.prepare(&refs)?;
                        let mut out = vec![0f32; kestrel_quant::repack::R * t_len];
                        let t = Instant::now();
                        for _ in 0..reps {
                            for g in 0..rows / kestrel_quant::repack::R {
                                packed.dot_group(g, &prepared, &mut out)?;
                                sink += out[0];
                            }
                        }
                        let s = t.elapsed().as_secs_f64();
                        std::hint::black_box(sink);
                        line("repacked:", s);
                    }
                }
            }
        }
    }
    Ok(())
}
