//! The mat-vec cases: every type, token count, epilogue and warps per row; the fused q/k/v
//! launch; and the mat-vec speed lines.

use super::ggml;
use super::{cfg, random_matrix, rel_err, CaseResult, Rng};
use crate::device::Gpu;
use crate::error::CudaError;
use crate::error::Result;
use crate::weights::{to_device_layout, Kind};
use cudarc::driver::PushKernelArg;

/// The mat-vec kernels: every type, token count and epilogue, against f64 dot products of the
/// dequantized weights. 8-bit activations cost about 0.5% (one step of 127 per block):
/// tolerance 1e-2 there, 1e-4 for f32 activations.
pub fn check_matvec(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    let (rows, cols) = (1536, 4096);
    for kind in [
        Kind::Q4K,
        Kind::Q6K,
        Kind::Q8_0,
        Kind::Q5_0,
        Kind::Q4_0,
        Kind::F16,
        Kind::F32,
    ] {
        let (file, w) = random_matrix(kind, rows, cols, rng)?;
        let (file2, w2) = random_matrix(kind, rows, cols, rng)?;
        let dw = gpu.upload(&to_device_layout(kind, &file))?;
        let dw2 = gpu.upload(&to_device_layout(kind, &file2))?;
        for nt in [1usize, 2, 4, 8] {
            let x = rng.vec(nt * cols, 1.0);
            let dx = gpu.upload_f32(&x)?;
            let dq = gpu.alloc(nt * cols)?;
            let dd = gpu.alloc(nt * cols / 32 * 8)?;
            let f = gpu.func("quantize_q")?;
            let n = cols as i32;
            // SAFETY: buffers sized above; arguments match the kernel.
            unsafe {
                gpu.stream
                    .launch_builder(&f)
                    .arg(&dx.ptr)
                    .arg(&dq.ptr)
                    .arg(&dd.ptr)
                    .arg(&n)
                    .launch(cfg((nt as u32, 1, 1), 256))?;
            }
            // f64 dots, once per token count
            let mut g1 = vec![0f64; nt * rows];
            let mut g2 = vec![0f64; nt * rows];
            for t in 0..nt {
                let xt = &x[t * cols..(t + 1) * cols];
                for r in 0..rows {
                    let dot = |m: &[f32]| -> f64 {
                        m[r * cols..(r + 1) * cols]
                            .iter()
                            .zip(xt)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum()
                    };
                    g1[t * rows + r] = dot(&w);
                    g2[t * rows + r] = dot(&w2);
                }
            }
            let wprs: &[usize] = if kind.int8_activations() {
                &[1, 2, 4]
            } else {
                &[1, 4]
            };
            for epi in 0..3 {
                for &wpr in wprs {
                    let base = rng.vec(nt * rows, 1.0);
                    let dout = gpu.upload_f32(&base)?;
                    let f = gpu.func(&format!("mv_{}_{nt}_{epi}_{wpr}", kind.name()))?;
                    let (r, c) = (rows as i32, cols as i32);
                    // SAFETY: as above.
                    unsafe {
                        gpu.stream
                            .launch_builder(&f)
                            .arg(&dw.ptr)
                            .arg(&dw2.ptr)
                            .arg(&r)
                            .arg(&c)
                            .arg(&dq.ptr)
                            .arg(&dd.ptr)
                            .arg(&c)
                            .arg(&dx.ptr)
                            .arg(&dout.ptr)
                            .arg(&r)
                            .launch(cfg((rows.div_ceil(4 / wpr) as u32, 1, 1), 128))?;
                    }
                    let got = gpu.read_f32(dout.ptr, nt * rows)?;
                    let want: Vec<f32> = (0..nt * rows)
                        .map(|i| {
                            let g = g1[i];
                            (match epi {
                                0 => g,
                                1 => base[i] as f64 + g,
                                _ => g / (1.0 + (-g).exp()) * g2[i],
                            }) as f32
                        })
                        .collect();
                    let tol = if kind.int8_activations() { 1e-2 } else { 1e-4 };
                    out.push(CaseResult {
                        op: format!(
                            "matvec {} [{rows}x{cols}] tokens {nt} epilogue {} warps/row {wpr}",
                            kind.name(),
                            ["store", "add", "swiglu"][epi]
                        ),
                        err: rel_err(&got, &want),
                        tol,
                    });
                }
            }
        }
    }
    Ok(())
}

/// The fused mat-vec: up to four matrices of different types in one launch (attention's
/// q/k/v; a DeltaNet layer's qkv, z, alpha and beta, the last two of a few rows).
pub fn check_mvx(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    let cols = 1536;
    for (kinds, rows, nt) in [
        (vec![Kind::Q4K, Kind::Q4K, Kind::Q6K], vec![512usize, 128, 128], 1usize),
        (vec![Kind::Q8_0, Kind::Q5_0, Kind::Q4_0], vec![512, 128, 128], 4),
        (vec![Kind::F32, Kind::F16, Kind::F32], vec![512, 128, 128], 2),
        (vec![Kind::Q4K, Kind::Q4K, Kind::Q4K, Kind::Q6K], vec![384, 256, 16, 16], 1),
        (vec![Kind::Q6K, Kind::Q4K, Kind::Q8_0, Kind::Q8_0], vec![384, 256, 16, 16], 8),
    ] {
        let n_mats = kinds.len();
        let mats: Vec<(Vec<u8>, Vec<f32>)> = (0..n_mats)
            .map(|i| random_matrix(kinds[i], rows[i], cols, rng))
            .collect::<Result<_>>()?;
        let devs: Vec<_> = (0..n_mats)
            .map(|i| gpu.upload(&to_device_layout(kinds[i], &mats[i].0)))
            .collect::<Result<_>>()?;
        let outs: Vec<_> = (0..n_mats)
            .map(|i| gpu.alloc(nt * rows[i] * 4))
            .collect::<Result<_>>()?;
        let x = rng.vec(nt * cols, 1.0);
        let dx = gpu.upload_f32(&x)?;
        let (dq, dd) = (gpu.alloc(nt * cols)?, gpu.alloc(nt * cols / 32 * 8)?);
        let qf = gpu.func("quantize_q")?;
        let n = cols as i32;
        let f = gpu.func(&format!("mvx_{}", nt.next_power_of_two()))?;
        // absent matrices: no rows
        let (mut r, mut ty, mut wp, mut op) = (vec![0i32; 4], vec![0i32; 4], vec![0u64; 4], vec![0u64; 4]);
        for i in 0..n_mats {
            (r[i], ty[i], wp[i], op[i]) = (rows[i] as i32, kinds[i] as i32, devs[i].ptr, outs[i].ptr);
        }
        let total = rows.iter().sum::<usize>();
        // SAFETY: as in check_matvec.
        unsafe {
            gpu.stream
                .launch_builder(&qf)
                .arg(&dx.ptr)
                .arg(&dq.ptr)
                .arg(&dd.ptr)
                .arg(&n)
                .launch(cfg((nt as u32, 6, 1), 256))?;
            gpu.stream
                .launch_builder(&f)
                .arg(&wp[0])
                .arg(&r[0])
                .arg(&ty[0])
                .arg(&op[0])
                .arg(&wp[1])
                .arg(&r[1])
                .arg(&ty[1])
                .arg(&op[1])
                .arg(&wp[2])
                .arg(&r[2])
                .arg(&ty[2])
                .arg(&op[2])
                .arg(&wp[3])
                .arg(&r[3])
                .arg(&ty[3])
                .arg(&op[3])
                .arg(&n)
                .arg(&dq.ptr)
                .arg(&dd.ptr)
                .arg(&dx.ptr)
                .launch(cfg((total.div_ceil(4) as u32, 1, 1), 128))?;
        }
        for i in 0..n_mats {
            let got = gpu.read_f32(outs[i].ptr, nt * rows[i])?;
            let w = &mats[i].1;
            let want: Vec<f32> = (0..nt * rows[i])
                .map(|j| {
                    let (t, row) = (j / rows[i], j % rows[i]);
                    w[row * cols..(row + 1) * cols]
                        .iter()
                        .zip(&x[t * cols..(t + 1) * cols])
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>() as f32
                })
                .collect();
            let tol = if kinds[i].int8_activations() {
                1e-2
            } else {
                1e-4
            };
            out.push(CaseResult {
                op: format!(
                    "fused mat-vec, part {i} of {n_mats}: {} [{}x{cols}] tokens {nt}",
                    kinds[i].name(),
                    rows[i]
                ),
                err: rel_err(&got, &want),
                tol,
            });
        }
    }
    Ok(())
}

/// Mat-vec speed per type on an 8B-shape FFN matrix (12288 x 4096): GB/s of weights read.
pub fn perf_matvec(gpu: &mut Gpu, rng: &mut Rng) -> Result<Vec<(String, f64, f64)>> {
    let (rows, cols) = (12288usize, 4096usize);
    let mut res = Vec::new();
    for kind in [Kind::Q4K, Kind::Q6K, Kind::Q8_0, Kind::Q5_0, Kind::Q4_0] {
        // random bytes (speed does not depend on the values); 8 copies rotate so the 50 MB
        // L2 never holds the weights
        let rb = kestrel_quant::row_bytes(ggml(kind), cols)
            .map_err(|e| CudaError::Other(e.to_string()))?;
        let dev: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
        let copies: Vec<_> = (0..8).map(|_| gpu.upload(&dev)).collect::<Result<_>>()?;
        let dx = gpu.upload_f32(&rng.vec(cols, 1.0))?;
        let (dq, dd, dout) = (
            gpu.alloc(cols)?,
            gpu.alloc(cols / 32 * 8)?,
            gpu.alloc(rows * 4)?,
        );
        let qf = gpu.func("quantize_q")?;
        let n = cols as i32;
        let wpr = crate::ops::warps_per_row(kind, cols);
        let f = gpu.func(&format!("mv_{}_1_0_{wpr}", kind.name()))?;
        let (r, c) = (rows as i32, cols as i32);
        // SAFETY: as in check_matvec.
        unsafe {
            gpu.stream
                .launch_builder(&qf)
                .arg(&dx.ptr)
                .arg(&dq.ptr)
                .arg(&dd.ptr)
                .arg(&n)
                .launch(cfg((1, 1, 1), 256))?;
        }
        let reps = 200;
        let launch = |i: usize| -> Result<()> {
            let w = copies[i % copies.len()].ptr;
            // SAFETY: as in check_matvec.
            unsafe {
                gpu.stream
                    .launch_builder(&f)
                    .arg(&w)
                    .arg(&w)
                    .arg(&r)
                    .arg(&c)
                    .arg(&dq.ptr)
                    .arg(&dd.ptr)
                    .arg(&c)
                    .arg(&dx.ptr)
                    .arg(&dout.ptr)
                    .arg(&r)
                    .launch(cfg((rows.div_ceil(4 / wpr) as u32, 1, 1), 128))?;
            }
            Ok(())
        };
        for i in 0..20 {
            launch(i)?;
        }
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let e0 = gpu.stream.record_event(timing)?;
        for i in 0..reps {
            launch(i)?;
        }
        let e1 = gpu.stream.record_event(timing)?;
        e1.synchronize()?;
        let us = e0.elapsed_ms(&e1)? as f64 * 1e3 / reps as f64;
        res.push((kind.name().to_string(), us, dev.len() as f64 / us / 1e3));
    }
    Ok(res)
}
