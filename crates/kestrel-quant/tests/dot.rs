//! Dot kernels: every SIMD backend against the scalar oracle, the oracle against an f64 dot of
//! the dequantized rows, the multi-row form against single rows, and the quantizers without a
//! gguf counterpart (Q4_K, Q6_K) by round-trip error.

mod common;

use common::*;
use kestrel_quant::{
    dequantize_row, quantize_row, row_bytes, vec_dot, vec_dot_multi_with, vec_dot_rows_with,
    vec_dot_type, Backend, GgmlType,
};

/// SIMD vs scalar: the integer block sums are identical, so only f32 summation order differs.
/// Bound: this fraction of sum |w_i * a_i| (the condition scale of the dot).
const SIMD_VS_SCALAR_TOL: f64 = 2e-6;
/// Scalar oracle vs f64 dot of dequantized rows: per-block f32 products and sums.
const ORACLE_VS_F64_TOL: f64 = 2e-6;

const DOT_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The 32-element block types (the panels', row quads' and prepared-activation kernels').
const BLOCK32: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

fn deq(ty: GgmlType, n: usize, b: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, b, &mut out).unwrap();
    out
}

fn act_row(rng: &mut Rng, w: GgmlType, n: usize) -> Vec<u8> {
    let a = vec_dot_type(w);
    let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    let mut out = vec![0u8; row_bytes(a, n).unwrap()];
    quantize_row(a, &x, &mut out).unwrap();
    out
}

/// (f64 dot, sum of |products|) of the dequantized rows.
fn exact(w: GgmlType, n: usize, x: &[u8], y: &[u8]) -> (f64, f64) {
    let (xf, yf) = (deq(w, n, x), deq(vec_dot_type(w), n, y));
    let mut dot: f64 = xf.iter().zip(&yf).map(|(a, b)| *a as f64 * *b as f64).sum();
    if vec_dot_type(w) == GgmlType::Q8_1 {
        // Q8_1 carries sum(y) only as s = fp16(d * sum q); the kernels use s for the min term
        // (as llama.cpp does), so swap the exact min * sum(y) for min * s, block by block.
        let bx = w.block_bytes() as usize;
        for (b, (xb, yb)) in x.chunks_exact(bx).zip(y.chunks_exact(36)).enumerate() {
            let m = kestrel_quant::float16::f16_to_f32(u16::from_le_bytes([xb[2], xb[3]])) as f64;
            let s = kestrel_quant::float16::f16_to_f32(u16::from_le_bytes([yb[2], yb[3]])) as f64;
            let sum_y: f64 = yf[32 * b..32 * b + 32].iter().map(|&v| v as f64).sum();
            dot += m * (s - sum_y);
        }
    }
    let mag = xf
        .iter()
        .zip(&yf)
        .map(|(a, b)| (*a as f64 * *b as f64).abs())
        .sum();
    (dot, mag)
}

#[test]
fn every_backend_matches_the_scalar_oracle() {
    let mut rng = Rng(0x5eed);
    let backends = Backend::available();
    println!("backends: {backends:?}, detected {:?}", Backend::detect());
    for w in DOT_TYPES {
        for n in [256usize, 1536, 4864] {
            let x = random_row(&mut rng, w, n);
            let acts: Vec<Vec<u8>> = (0..7).map(|_| act_row(&mut rng, w, n)).collect();
            let refs: Vec<&[u8]> = acts.iter().map(|a| a.as_slice()).collect();
            let mut oracle = vec![0f32; acts.len()];
            vec_dot_multi_with(Backend::Generic, w, n, &x, &refs, &mut oracle).unwrap();
            for (c, y) in acts.iter().enumerate() {
                let (e, mag) = exact(w, n, &x, y);
                let err = (oracle[c] as f64 - e).abs();
                assert!(
                    err <= ORACLE_VS_F64_TOL * mag + 1e-30,
                    "{w} n={n}: oracle {} vs f64 {e} (mag {mag})",
                    oracle[c]
                );
            }
            for &b in &backends {
                let mut got = vec![0f32; acts.len()];
                vec_dot_multi_with(b, w, n, &x, &refs, &mut got).unwrap();
                for (c, y) in acts.iter().enumerate() {
                    let (_, mag) = exact(w, n, &x, y);
                    let err = (got[c] as f64 - oracle[c] as f64).abs();
                    assert!(
                        err <= SIMD_VS_SCALAR_TOL * mag + 1e-30,
                        "{w} n={n} {b:?} row {c}: {} vs oracle {}",
                        got[c],
                        oracle[c]
                    );
                    // The multi-row kernels do per row exactly what the one-row kernel does.
                    let mut single = [0f32];
                    vec_dot_multi_with(b, w, n, &x, &refs[c..c + 1], &mut single).unwrap();
                    assert_eq!(
                        single[0].to_bits(),
                        got[c].to_bits(),
                        "{w} {b:?} multi vs single, row {c}"
                    );
                }
            }
        }
    }
}

/// Row lengths with odd block counts (a lone tail block, 1-3 blocks past the 4-block loop).
fn odd_lengths(w: GgmlType) -> Vec<usize> {
    let bl = w.block_len() as usize;
    if bl == 1 {
        vec![1, 37, 1000]
    } else if bl == 256 {
        vec![256, 768, 1280, 2304]
    } else {
        vec![32, 64, 96, 160, 224, 1184, 896]
    }
}

/// Every backend, odd lengths, batch sizes 1, 2, 3, 5, 8, 9, 17 (every group and tail shape of
/// `vec_dot_multi`): within tolerance of the oracle, and bit-identical to the one-row call.
#[test]
fn multi_row_batches_of_odd_sizes_match_the_oracle() {
    let mut rng = Rng(0x0dd5);
    for w in DOT_TYPES {
        for n in odd_lengths(w) {
            let x = random_row(&mut rng, w, n);
            let acts: Vec<Vec<u8>> = (0..17).map(|_| act_row(&mut rng, w, n)).collect();
            for t in [1usize, 2, 3, 5, 8, 9, 17] {
                let refs: Vec<&[u8]> = acts[..t].iter().map(|a| a.as_slice()).collect();
                let mut oracle = vec![0f32; t];
                vec_dot_multi_with(Backend::Generic, w, n, &x, &refs, &mut oracle).unwrap();
                for b in Backend::available() {
                    let mut got = vec![0f32; t];
                    vec_dot_multi_with(b, w, n, &x, &refs, &mut got).unwrap();
                    for c in 0..t {
                        let (_, mag) = exact(w, n, &x, refs[c]);
                        let err = (got[c] as f64 - oracle[c] as f64).abs();
                        assert!(
                            err <= SIMD_VS_SCALAR_TOL * mag + 1e-30,
                            "{w} n={n} t={t} {b:?} row {c}: {} vs oracle {}",
                            got[c],
                            oracle[c]
                        );
                        let mut single = [0f32];
                        vec_dot_multi_with(b, w, n, &x, &refs[c..c + 1], &mut single).unwrap();
                        assert_eq!(
                            single[0].to_bits(),
                            got[c].to_bits(),
                            "{w} n={n} t={t} {b:?} row {c}"
                        );
                    }
                }
            }
        }
    }
}

/// llama.cpp's tiled Q6_K x Q8_K order, written out: per super-block the exact integer
/// `sum_j sc_j sum_l (q - 32) y`, then `acc = fma(float(isum) * d, yd, acc)`.
#[allow(clippy::needless_range_loop)]
fn q6k_tiled_order(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for i in 0..n / 256 {
        let xb = &x[i * 210..(i + 1) * 210];
        let yb = &y[i * 292..(i + 1) * 292];
        let (ql, qh, sc) = (&xb[..128], &xb[128..192], &xb[192..208]);
        let d = kestrel_quant::float16::f16_to_f32(u16::from_le_bytes([xb[208], xb[209]]));
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let mut q = [0i32; 256];
        for half in 0..2 {
            let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
            for l in 0..32 {
                let o = 128 * half;
                q[o + l] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
                q[o + l + 32] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                q[o + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                q[o + l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            }
        }
        let mut isum = 0i32;
        for j in 0..16 {
            let s: i32 = (16 * j..16 * j + 16)
                .map(|e| q[e] * yb[4 + e] as i8 as i32)
                .sum();
            isum += sc[j] as i8 as i32 * s;
        }
        acc = ((isum as f32) * d).mul_add(yd, acc);
    }
    acc
}

/// `vec_dot_rows` (the tiled kernel and its fallback) equals `vec_dot_multi` per weight row, bit
/// for bit, for 1..=9 weight rows and odd batch sizes, on every backend and type — except Q6_K
/// on AVX-512 from 8 activation rows on, which follows llama.cpp's tiled order instead.
#[test]
fn tiled_rows_equal_multi_per_row() {
    let mut rng = Rng(0x711e);
    for w in DOT_TYPES {
        for n in odd_lengths(w) {
            let xs: Vec<Vec<u8>> = (0..9).map(|_| random_row(&mut rng, w, n)).collect();
            let acts: Vec<Vec<u8>> = (0..17).map(|_| act_row(&mut rng, w, n)).collect();
            for b in Backend::available() {
                for m in [1usize, 2, 3, 4, 5, 8, 9] {
                    for t in [1usize, 2, 3, 5, 8, 9, 17] {
                        let rows: Vec<&[u8]> = xs[..m].iter().map(|a| a.as_slice()).collect();
                        let refs: Vec<&[u8]> = acts[..t].iter().map(|a| a.as_slice()).collect();
                        let mut got = vec![0f32; m * t];
                        vec_dot_rows_with(b, w, n, &rows, &refs, &mut got).unwrap();
                        for r in 0..m {
                            let mut want = vec![0f32; t];
                            vec_dot_multi_with(b, w, n, rows[r], &refs, &mut want).unwrap();
                            if w == GgmlType::Q6_K
                                && b == Backend::Avx512Vnni
                                && t >= kestrel_quant::dot::BATCHED_MIN_TOKENS
                            {
                                // llama.cpp's tiled K-quant order (see `dot::BATCHED_MIN_TOKENS`).
                                for c in 0..t {
                                    want[c] = q6k_tiled_order(n, rows[r], refs[c]);
                                }
                            }
                            let mut oracle = vec![0f32; t];
                            vec_dot_multi_with(Backend::Generic, w, n, rows[r], &refs, &mut oracle)
                                .unwrap();
                            for c in 0..t {
                                assert_eq!(
                                    got[r * t + c].to_bits(),
                                    want[c].to_bits(),
                                    "{w} n={n} {b:?} m={m} t={t} ({r}, {c}): {} vs {}",
                                    got[r * t + c],
                                    want[c]
                                );
                                let (_, mag) = exact(w, n, rows[r], refs[c]);
                                let err = (got[r * t + c] as f64 - oracle[c] as f64).abs();
                                assert!(err <= SIMD_VS_SCALAR_TOL * mag + 1e-30, "{w} n={n} {b:?}");
                            }
                        }
                    }
                }
            }
        }
    }
    let mut out = [0f32; 3];
    let x = vec![0u8; 144];
    let y = vec![0u8; 292];
    assert!(vec_dot_rows_with(
        Backend::Generic,
        GgmlType::Q4_K,
        256,
        &[&x, &x],
        &[&y, &y],
        &mut out
    )
    .is_err());
}

#[test]
fn bad_shapes_are_errors() {
    use kestrel_quant::{try_vec_dot, vec_dot_multi, QuantError};
    let x = vec![0u8; 144];
    let y = vec![0u8; 292];
    assert!(try_vec_dot(GgmlType::Q4_K, 256, &x, &y).is_ok());
    assert!(matches!(
        try_vec_dot(GgmlType::Q4_K, 256, &x[..143], &y),
        Err(QuantError::ByteLen { .. })
    ));
    assert!(matches!(
        try_vec_dot(GgmlType::Q4_K, 256, &x, &y[..291]),
        Err(QuantError::ByteLen { .. })
    ));
    assert!(matches!(
        try_vec_dot(GgmlType::Q4_K, 255, &x, &y),
        Err(QuantError::NotBlockMultiple { .. })
    ));
    assert!(matches!(
        try_vec_dot(GgmlType::I8, 1, &x[..1], &y[..1]),
        Err(QuantError::Unsupported { .. })
    ));
    let mut out = [0f32; 1];
    assert!(matches!(
        vec_dot_multi(GgmlType::Q4_K, 256, &x, &[&y, &y], &mut out),
        Err(QuantError::Len { .. })
    ));
    assert_eq!(vec_dot(GgmlType::Q4_K, 256, &x, &y), 0.0);
}

/// Relative RMS error of quantize -> dequantize over `rows` rows of gaussian data.
fn round_trip_rms(ty: GgmlType, rows: usize) -> f64 {
    let mut rng = Rng(0xbeef);
    let n = 4096;
    let (mut se, mut ss) = (0f64, 0f64);
    for _ in 0..rows {
        let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let mut q = vec![0u8; row_bytes(ty, n).unwrap()];
        quantize_row(ty, &x, &mut q).unwrap();
        let back = deq(ty, n, &q);
        for (a, b) in x.iter().zip(&back) {
            se += ((a - b) as f64).powi(2);
            ss += (*a as f64).powi(2);
        }
    }
    (se / ss).sqrt()
}

/// gguf 0.19 has no Q4_K / Q6_K quantizer, so these are held to the error of llama.cpp's
/// reference quantizer (`quantize_row_q4_K_ref` / `_q6_K_ref`, no imatrix), which ours ports
/// operation by operation. Measured here on 64 x 4096 near-gaussian values (Irwin-Hall, 4 terms;
/// relative RMS): Q4_K 0.0689, Q6_K 0.0170 (for scale: Q4_0 0.0819, Q8_0 0.0051, same data).
/// The bounds leave 2% headroom for summation-order noise, not for a worse algorithm.
#[test]
fn k_quant_round_trip_error_is_llama_cpp_reference_level() {
    let q4k = round_trip_rms(GgmlType::Q4_K, 64);
    let q6k = round_trip_rms(GgmlType::Q6_K, 64);
    let q4_0 = round_trip_rms(GgmlType::Q4_0, 64);
    let q8_0 = round_trip_rms(GgmlType::Q8_0, 64);
    println!("relative RMS: Q4_K {q4k:.4} Q6_K {q6k:.4} Q4_0 {q4_0:.4} Q8_0 {q8_0:.4}");
    assert!(q4k <= 0.0689 * 1.02, "Q4_K {q4k}");
    assert!(q6k <= 0.0170 * 1.02, "Q6_K {q6k}");
    assert!(q4k < q4_0 && q6k < q4k && q8_0 < q6k);
}

/// `matvec` (decode's whole-range call) equals `vec_dot_multi` row by row, bit for bit.
#[test]
fn matvec_equals_row_by_row() {
    use kestrel_quant::{matvec, quantize_row, row_bytes, vec_dot_multi, vec_dot_type, GgmlType};
    let mut seed = 12345u64;
    let mut rnd = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    };
    for ty in BLOCK32.into_iter().chain([GgmlType::Q4_K, GgmlType::Q6_K]) {
        let (n, rows) = (512, 7);
        let rb = row_bytes(ty, n).unwrap();
        let mut w = vec![0u8; rb * rows];
        for r in 0..rows {
            let x: Vec<f32> = (0..n).map(|_| rnd()).collect();
            quantize_row(ty, &x, &mut w[r * rb..(r + 1) * rb]).unwrap();
        }
        let at = vec_dot_type(ty);
        let mut act = vec![0u8; row_bytes(at, n).unwrap()];
        let x: Vec<f32> = (0..n).map(|_| rnd()).collect();
        quantize_row(at, &x, &mut act).unwrap();
        let mut got = vec![0f32; rows];
        matvec(ty, n, &w, &act, &mut got).unwrap();
        for r in 0..rows {
            let mut one = [0f32];
            vec_dot_multi(ty, n, &w[r * rb..(r + 1) * rb], &[&act], &mut one).unwrap();
            assert_eq!(got[r].to_bits(), one[0].to_bits(), "{ty:?} row {r}");
        }
        assert!(matvec(ty, n, &w[1..], &act, &mut got).is_err());
    }
}

/// `matmul_few` (batched decode: prepared activations on AVX-512, row quads on AVX2) equals
/// `vec_dot_multi` per row and token, bit for bit, for the 32-element types, 1..=8 tokens.
#[test]
fn matmul_few_equals_row_by_row() {
    use kestrel_quant::{matmul_few, row_bytes, vec_dot_multi, vec_dot_type};
    let mut rng = Rng(0xfe77);
    for ty in BLOCK32 {
        let (n, rows) = (320, 9);
        let rb = row_bytes(ty, n).unwrap();
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(&mut rng, ty, n))
            .collect();
        let acts: Vec<Vec<u8>> = (0..8).map(|_| act_row(&mut rng, ty, n)).collect();
        assert_eq!(acts[0].len(), row_bytes(vec_dot_type(ty), n).unwrap());
        for t in 1..=8 {
            let a: Vec<&[u8]> = acts[..t].iter().map(|v| v.as_slice()).collect();
            let mut got = vec![0f32; rows * t];
            matmul_few(ty, n, &w, &a, &mut got).unwrap();
            for r in 0..rows {
                let mut want = vec![0f32; t];
                vec_dot_multi(ty, n, &w[r * rb..(r + 1) * rb], &a, &mut want).unwrap();
                for c in 0..t {
                    assert_eq!(
                        got[r * t + c].to_bits(),
                        want[c].to_bits(),
                        "{ty:?} t {t} row {r} token {c}"
                    );
                }
            }
        }
    }
}
