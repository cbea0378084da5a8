//! The row-wise cases: RMSNorm, the q/k/v epilogue, embeddings and the dequantize + GEMM path
//! of prefill.

use super::{bytes_i32, cfg, random_matrix, rel_err, CaseResult, Rng};
use crate::device::Gpu;
use crate::error::Result;
use crate::weights::{to_device_layout, Kind};
use cudarc::driver::PushKernelArg;

/// RMSNorm (and the 8-bit blocks it writes) against kestrel-models' ops::rms_norm.
pub fn check_norm(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    for (t, n) in [(1usize, 1536usize), (7, 4096), (33, 64)] {
        let x = rng.vec(t * n, 3.0);
        let w = rng.vec(n, 1.0);
        let mut want = x.clone();
        kestrel_models::ops::rms_norm(&mut want, &w, 1e-6);
        let (dx, dw, dout) = (
            gpu.upload_f32(&x)?,
            gpu.upload_f32(&w)?,
            gpu.alloc(t * n * 4)?,
        );
        let (dq, dd) = (gpu.alloc(t * n)?, gpu.alloc(t * n / 32 * 8)?);
        let f = gpu.func("rms_norm_q")?;
        let (ni, eps) = (n as i32, 1e-6f32);
        // SAFETY: as in check_matvec.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&dx.ptr)
                .arg(&dw.ptr)
                .arg(&dout.ptr)
                .arg(&dq.ptr)
                .arg(&dd.ptr)
                .arg(&ni)
                .arg(&eps)
                .launch(cfg((t as u32, n.div_ceil(256) as u32, 1), 256))?;
        }
        let got = gpu.read_f32(dout.ptr, t * n)?;
        out.push(CaseResult {
            op: format!("rms_norm [{t}x{n}]"),
            err: rel_err(&got, &want),
            tol: 1e-5,
        });
        // the 8-bit copy decodes back to the normed row within one step per block
        let mut q = vec![0u8; t * n];
        gpu.read(dq.ptr, &mut q)?;
        let d = gpu.read_f32(dd.ptr, t * n / 32 * 2)?;
        let deq: Vec<f32> = q
            .iter()
            .enumerate()
            .map(|(i, &b)| b as i8 as f32 * d[2 * (i / 32)])
            .collect();
        out.push(CaseResult {
            op: format!("rms_norm 8-bit blocks [{t}x{n}]"),
            err: rel_err(&deq, &want),
            tol: 1e-2,
        });
    }
    Ok(())
}

/// The logits' argmax on the GPU against the sampler's own (`greedy::argmax_logits`: ties to
/// the lowest id, NaN as -inf): rows of the real vocabularies with planted ties, NaN, and a row
/// of nothing but -inf / NaN. The error is the count of rows picked differently.
pub fn check_argmax(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    use kestrel_sampler::processors::greedy::argmax_logits;
    for (rows, n) in [(1usize, 151_936usize), (32, 248_320), (5, 1000), (3, 17)] {
        let mut x = rng.vec(rows * n, 8.0);
        for (r, row) in x.chunks_exact_mut(n).enumerate() {
            let pick = |rng: &mut Rng| (rng.next_u64() % n as u64) as usize;
            match r % 5 {
                // the maximum at two places: the lower index wins
                0 => {
                    let (a, b) = (pick(rng), pick(rng));
                    row[a] = 100.0;
                    row[b] = 100.0;
                }
                1 => {
                    let a = pick(rng);
                    row[a] = f32::NAN;
                    row[pick(rng)] = f32::INFINITY;
                }
                2 => row.fill(f32::NEG_INFINITY),
                3 => {
                    row.fill(f32::NAN);
                    let a = pick(rng);
                    row[a] = f32::NEG_INFINITY;
                }
                _ => {}
            }
        }
        let want: Vec<u32> = x
            .chunks_exact(n)
            .map(|r| argmax_logits(r).unwrap_or(0))
            .collect();
        let dx = gpu.upload_f32(&x)?;
        let part = gpu.alloc(rows * crate::ops::ARGMAX_PARTS * 8)?;
        let ids = gpu.alloc(rows * 4)?;
        crate::ops::launch_argmax(gpu, dx.ptr, rows, n, part.ptr, ids.ptr)?;
        let mut got = vec![0i32; rows];
        gpu.read(ids.ptr, &mut got)?;
        let wrong = got
            .iter()
            .zip(&want)
            .filter(|(&g, &w)| g as u32 != w)
            .count();
        out.push(CaseResult {
            op: format!("argmax [{rows}x{n}]"),
            err: wrong as f64,
            tol: 0.0,
        });
    }
    Ok(())
}

/// Bias + per-head norm + RoPE + KV write against the CPU ops; both RoPE layouts.
pub fn check_epilogue(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    for (neox, nh, nkv, hd, t) in [
        (true, 12usize, 2usize, 128usize, 3usize),
        (false, 4, 2, 16, 5),
        (true, 32, 8, 128, 1),
    ] {
        let (qd, kvd) = (nh * hd, nkv * hd);
        let positions: Vec<usize> = (0..t).map(|i| 17 + 1000 * i).collect();
        let (q, k, v) = (
            rng.vec(t * qd, 1.0),
            rng.vec(t * kvd, 1.0),
            rng.vec(t * kvd, 1.0),
        );
        let (bq, bk, bv) = (rng.vec(qd, 0.5), rng.vec(kvd, 0.5), rng.vec(kvd, 0.5));
        let (qn, kn) = (rng.vec(hd, 1.0), rng.vec(hd, 1.0));
        let base = 1e6f32;
        let (mut wq, mut wk, mut wv) = (q.clone(), k.clone(), v.clone());
        kestrel_models::ops::add_bias(&mut wq, &bq);
        kestrel_models::ops::add_bias(&mut wk, &bk);
        kestrel_models::ops::add_bias(&mut wv, &bv);
        kestrel_models::ops::rms_norm(&mut wq, &qn, 1e-6);
        kestrel_models::ops::rms_norm(&mut wk, &kn, 1e-6);
        let rope = kestrel_models::ops::Rope::new(&positions, hd, base, neox);
        rope.apply(&mut wq, hd);
        rope.apply(&mut wk, hd);
        let rows: Vec<i32> = (0..t as i32).map(|i| 3 * i + 1).collect();
        let n_rows = 3 * t + 2;
        let (dq, dk, dv) = (
            gpu.upload_f32(&q)?,
            gpu.upload_f32(&k)?,
            gpu.upload_f32(&v)?,
        );
        let (dbq, dbk, dbv, dqn, dkn) = (
            gpu.upload_f32(&bq)?,
            gpu.upload_f32(&bk)?,
            gpu.upload_f32(&bv)?,
            gpu.upload_f32(&qn)?,
            gpu.upload_f32(&kn)?,
        );
        let (kc, vc) = (gpu.alloc(n_rows * kvd * 2)?, gpu.alloc(n_rows * kvd * 2)?);
        let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        let (dpos, drows) = (
            gpu.upload(&bytes_i32(&pos))?,
            gpu.upload(&bytes_i32(&rows))?,
        );
        let f = gpu.func("qkv_epilogue")?;
        let (a, b, c, rd) = (nh as i32, nkv as i32, hd as i32, hd as i32);
        let (eps, ts, nx) = (1e-6f32, base.powf(-2.0 / hd as f32), neox as i32);
        // SAFETY: as in check_matvec.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&dq.ptr)
                .arg(&dk.ptr)
                .arg(&dv.ptr)
                .arg(&a)
                .arg(&b)
                .arg(&c)
                .arg(&dbq.ptr)
                .arg(&dbk.ptr)
                .arg(&dbv.ptr)
                .arg(&dqn.ptr)
                .arg(&dkn.ptr)
                .arg(&eps)
                .arg(&dpos.ptr)
                .arg(&rd)
                .arg(&ts)
                .arg(&nx)
                .arg(&kc.ptr)
                .arg(&vc.ptr)
                .arg(&drows.ptr)
                .launch(cfg(
                    ((nh + 2 * nkv) as u32, t as u32, 1),
                    hd.div_ceil(32) as u32 * 32,
                ))?;
        }
        let got_q = gpu.read_f32(dq.ptr, t * qd)?;
        let read_rows = |buf: u64| -> Result<Vec<f32>> {
            let mut all = vec![0u8; n_rows * kvd * 2];
            gpu.read(buf, &mut all)?;
            Ok(rows
                .iter()
                .flat_map(|&r| {
                    let r = r as usize;
                    all[r * kvd * 2..(r + 1) * kvd * 2]
                        .chunks_exact(2)
                        .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
                        .collect::<Vec<_>>()
                })
                .collect())
        };
        let (got_k, got_v) = (read_rows(kc.ptr)?, read_rows(vc.ptr)?);
        let name = format!(
            "qkv epilogue ({} rope, {nh}/{nkv} heads of {hd}, {t} tokens)",
            if neox { "neox" } else { "normal" }
        );
        out.push(CaseResult {
            op: format!("{name}: q"),
            err: rel_err(&got_q, &wq),
            tol: 1e-4,
        });
        out.push(CaseResult {
            op: format!("{name}: k in cache (f16)"),
            err: rel_err(&got_k, &wk),
            tol: 1e-3,
        });
        out.push(CaseResult {
            op: format!("{name}: v in cache (f16)"),
            err: rel_err(&got_v, &wv),
            tol: 1e-3,
        });
    }
    Ok(())
}

/// Embedding rows and the f16 dequantization + cuBLAS GEMM of the prefill path.
pub fn check_gemm_embed(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    let (rows, cols, t) = (1024usize, 1536usize, 77usize);
    for kind in Kind::QUANTIZED.into_iter().chain([Kind::F16, Kind::F32]) {
        let (file, w) = random_matrix(kind, rows, cols, rng)?;
        let dw = gpu.upload(&to_device_layout(kind, &file))?;
        let ids: Vec<u32> = (0..t)
            .map(|_| (rng.next_u64() % rows as u64) as u32)
            .collect();
        let dids = gpu.upload(
            &ids.iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        let demb = gpu.alloc(t * cols * 4)?;
        let f = gpu.func("embed_rows")?;
        let (ty, r, c) = (kind as i32, rows as i32, cols as i32);
        // SAFETY: as in check_matvec.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&ty)
                .arg(&dw.ptr)
                .arg(&r)
                .arg(&c)
                .arg(&dids.ptr)
                .arg(&demb.ptr)
                .launch(cfg((t as u32, 1, 1), 256))?;
        }
        let got = gpu.read_f32(demb.ptr, t * cols)?;
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| w[i as usize * cols..(i as usize + 1) * cols].to_vec())
            .collect();
        out.push(CaseResult {
            op: format!("embed rows {} [{t} of {rows}x{cols}]", kind.name()),
            err: rel_err(&got, &want),
            tol: 1e-6,
        });
        // GEMM: x [t, cols] (f16) . W^T -> [t, rows]
        let x = rng.vec(t * cols, 1.0);
        let dx = gpu.upload_f32(&x)?;
        let (dx16, dw16, dout) = (
            gpu.alloc(t * cols * 2)?,
            gpu.alloc(rows * cols * 2)?,
            gpu.alloc(t * rows * 4)?,
        );
        super::f16_rows(gpu, dx.ptr, dx16.ptr, t * cols)?;
        crate::matmul::dequant_f16(gpu, kind, dw.ptr, rows, cols, 0, rows, dw16.ptr)?;
        gpu.gemm_f16(rows, t, cols, dw16.ptr, dx16.ptr, dout.ptr, rows, 0.0)?;
        let got = gpu.read_f32(dout.ptr, t * rows)?;
        let mut want = vec![0f32; t * rows];
        for ti in 0..t {
            for ri in 0..rows {
                want[ti * rows + ri] = (0..cols)
                    .map(|k| w[ri * cols + k] as f64 * x[ti * cols + k] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out.push(CaseResult {
            op: format!(
                "dequant f16 + cuBLAS GEMM {} [{t}x{cols}] x [{rows}x{cols}]^T",
                kind.name()
            ),
            err: rel_err(&got, &want),
            tol: 2e-3,
        });
    }
    Ok(())
}
