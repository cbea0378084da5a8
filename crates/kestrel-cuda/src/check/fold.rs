//! The folded mat-vecs (`fold.rs`, `mvb_*` in `kernels/matvec.cu`): the producer's f32 output
//! (the residual add, the SwiGLU) against f64 dots, and its 8-bit copy through the mat-vecs that
//! read it (each kernel family, with the folded norm's 1 / rms applied from the sums of squares)
//! against the f64 product of the norm of the producer's own output.

use super::{cfg, random_matrix, rel_err, CaseResult, MvLaunch, Rng};
use crate::device::{DevBuf, Gpu};
use crate::error::Result;
use crate::weights::{to_device_layout, Kind};
use cudarc::driver::PushKernelArg;

/// f64 `w · x` for each of `rows` rows of `w` (rows x x.len(), row-major).
fn dots(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len())
        .map(|r| r.iter().zip(x).map(|(a, b)| *a as f64 * b).sum())
        .collect()
}

/// One token's 8-bit copy of `n` values: (quants, scales, sums of squares).
fn q8_bufs(gpu: &Gpu, n: usize) -> Result<(DevBuf, DevBuf, DevBuf)> {
    Ok((
        gpu.alloc(n)?,
        gpu.alloc(n / 32 * 8)?,
        gpu.alloc(n / 32 * 4)?,
    ))
}

/// The mat-vecs that read a folded copy: row groups, half-warp rows, the SwiGLU's warps per
/// row, and the fused launch's three kernels (one matrix), each `out = wc · copy` (SwiGLU:
/// silu(wc · copy) * (wc2 · copy)). Returns (label, output) per kernel.
#[allow(clippy::too_many_arguments)]
fn consumers(
    gpu: &mut Gpu,
    kind: Kind,
    wc: &DevBuf,
    wc2: &DevBuf,
    rows: usize,
    cols: usize,
    q: (u64, u64, u64),
) -> Result<Vec<(String, bool, Vec<f32>)>> {
    let k = kind.name();
    // the `_f` kernels where the copy comes with sums of squares
    let fs = if q.2 != 0 { "_f" } else { "" };
    let mut res = Vec::new();
    let (r, c, none) = (rows as i32, cols as i32, 0u64);
    for (name, grid, swiglu) in [
        (format!("mv_{k}_1_0_r1{fs}"), rows.div_ceil(4), false),
        (format!("mv_{k}_1_0_r2{fs}"), rows.div_ceil(8), false),
        (format!("mv_{k}_1_0_h1{fs}"), rows.div_ceil(8), false),
        (format!("mv_{k}_1_2_1{fs}"), rows.div_ceil(4), true),
        (format!("mv_{k}_1_2_r2{fs}"), rows.div_ceil(8), true),
    ] {
        let out = gpu.upload_f32(&vec![f32::NAN; rows])?;
        let f = gpu.func(&name)?;
        let mv = MvLaunch {
            w: wc.ptr,
            w2: wc2.ptr,
            rows,
            cols,
            q: (q.0, q.1),
            xf: 0,
            out: out.ptr,
            xs: q.2,
        };
        // SAFETY: wc / wc2 hold rows x cols of `kind` in the device layout, the copy one token
        // of cols, out rows floats.
        unsafe { mv.run(gpu, &f, grid as u32)? };
        res.push((name, swiglu, gpu.read_f32(out.ptr, rows)?));
    }
    for (base, rpw) in [("mvx_1", 1), ("mvx_1_r2", 2), ("mvx_1_h1", 2)] {
        let name = format!("{base}{fs}");
        let out = gpu.upload_f32(&vec![f32::NAN; rows])?;
        let f = gpu.func(&name)?;
        let (ty, zero, nul) = (kind as i32, 0i32, 0u64);
        // SAFETY: as above; the absent matrices have no rows.
        unsafe {
            let mut b = gpu.stream.launch_builder(&f);
            b.arg(&wc.ptr).arg(&r).arg(&ty).arg(&out.ptr);
            for _ in 0..3 {
                b.arg(&nul).arg(&zero).arg(&zero).arg(&nul);
            }
            b.arg(&c).arg(&q.0).arg(&q.1).arg(&none).arg(&q.2);
            b.launch(cfg((rows.div_ceil(4 * rpw) as u32, 1, 1), 128))?;
        }
        res.push((name, false, gpu.read_f32(out.ptr, rows)?));
    }
    Ok(res)
}

/// Every quantized type as the producer (residual with a folded norm, and SwiGLU), Q4_K and
/// Q6_K as the readers.
pub fn check_fold(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    // the producer's rows are the readers' columns: a multiple of 256 for the K-quants
    let (rows, cols, c_rows, eps) = (512usize, 1024usize, 96usize, 1e-6f32);
    let tol = 1e-2;
    for kind in Kind::QUANTIZED {
        let (file, w) = random_matrix(kind, rows, cols, rng)?;
        let (file2, w2) = random_matrix(kind, rows, cols, rng)?;
        let dw = gpu.upload(&to_device_layout(kind, &file))?;
        let dw2 = gpu.upload(&to_device_layout(kind, &file2))?;
        let x = rng.vec(cols, 1.0);
        let base = rng.vec(rows, 4.0);
        let g: Vec<f32> = rng.vec(rows, 0.5).iter().map(|v| 1.0 + v).collect();
        let dx = gpu.upload_f32(&x)?;
        let dg = gpu.upload_f32(&g)?;
        let (iq, id, _) = q8_bufs(gpu, cols)?;
        let qf = gpu.func("quantize_q")?;
        let n = cols as i32;
        // SAFETY: x holds cols floats, the copy one token of cols.
        unsafe {
            gpu.stream
                .launch_builder(&qf)
                .arg(&dx.ptr)
                .arg(&iq.ptr)
                .arg(&id.ptr)
                .arg(&n)
                .launch(cfg((1, 1, 1), 256))?;
        }
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let (d1, d2) = (dots(&w, &x64), dots(&w2, &x64));
        for epi in [1, 2] {
            let dout = gpu.upload_f32(&base)?;
            let (oq, od, os) = q8_bufs(gpu, rows)?;
            let f = gpu.func(&format!("mvb_{}_{epi}", kind.name()))?;
            let (r, c, none) = (rows as i32, cols as i32, 0u64);
            // the residual's copy is of out * g with sums of squares; the SwiGLU's of out
            let (gp, ssp) = if epi == 1 { (dg.ptr, os.ptr) } else { (0, 0) };
            // SAFETY: W / W2 hold rows x cols of `kind`, rows a multiple of 32; the input copy
            // one token of cols, out / g rows floats, the output copy one token of rows.
            unsafe {
                gpu.stream
                    .launch_builder(&f)
                    .arg(&dw.ptr)
                    .arg(&dw2.ptr)
                    .arg(&r)
                    .arg(&c)
                    .arg(&iq.ptr)
                    .arg(&id.ptr)
                    .arg(&none)
                    .arg(&dout.ptr)
                    .arg(&gp)
                    .arg(&eps)
                    .arg(&oq.ptr)
                    .arg(&od.ptr)
                    .arg(&ssp)
                    .launch(cfg(((rows / 32) as u32, 1, 1), 512))?;
            }
            let got = gpu.read_f32(dout.ptr, rows)?;
            let want: Vec<f32> = (0..rows)
                .map(|i| match epi {
                    1 => (base[i] as f64 + d1[i]) as f32,
                    _ => (d1[i] / (1.0 + (-d1[i]).exp()) * d2[i]) as f32,
                })
                .collect();
            let label = ["residual + folded norm", "SwiGLU"][epi - 1];
            out.push(CaseResult {
                op: format!("fold {} [{rows}x{cols}] {label}: producer", kind.name()),
                err: rel_err(&got, &want),
                tol,
            });
            // the readers' input: the norm of the producer's own output (or that output)
            let y: Vec<f64> = got.iter().map(|&v| v as f64).collect();
            let input: Vec<f64> = if epi == 1 {
                let ms = y.iter().map(|v| v * v).sum::<f64>() / rows as f64;
                let rs = 1.0 / (ms + eps as f64).sqrt();
                y.iter()
                    .zip(&g)
                    .map(|(v, gw)| v * rs * *gw as f64)
                    .collect()
            } else {
                y
            };
            for ck in [Kind::Q4K, Kind::Q6K] {
                let (cf, cw) = random_matrix(ck, c_rows, rows, rng)?;
                let (cf2, cw2) = random_matrix(ck, c_rows, rows, rng)?;
                let dc = gpu.upload(&to_device_layout(ck, &cf))?;
                let dc2 = gpu.upload(&to_device_layout(ck, &cf2))?;
                let (e1, e2) = (dots(&cw, &input), dots(&cw2, &input));
                for (name, swiglu, got) in
                    consumers(gpu, ck, &dc, &dc2, c_rows, rows, (oq.ptr, od.ptr, ssp))?
                {
                    let want: Vec<f32> = (0..c_rows)
                        .map(|i| match swiglu {
                            false => e1[i] as f32,
                            true => (e1[i] / (1.0 + (-e1[i]).exp()) * e2[i]) as f32,
                        })
                        .collect();
                    out.push(CaseResult {
                        op: format!(
                            "fold {} [{rows}x{cols}] {label}: read by {name}",
                            kind.name()
                        ),
                        err: rel_err(&got, &want),
                        // a SwiGLU multiplies two dots of int8 activations: twice the error
                        tol: if swiglu { 2.0 * tol } else { tol },
                    });
                }
            }
        }
    }
    Ok(())
}
