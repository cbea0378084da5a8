//! One harness for the backend's operations: every kernel on random inputs of real shapes
//! against the CPU reference (kestrel-quant's dequantization, kestrel-models' ops, plain f64
//! loops), each with its stated tolerance on ‖gpu − cpu‖ / ‖cpu‖; and a perf line per mat-vec
//! type (GB/s of weights against the bandwidth). `kestrel gpu-check` runs it on a GPU host;
//! the tests at the bottom run it when a GPU is present and say they skipped otherwise.

use crate::device::Gpu;
use crate::error::{CudaError, Result};
use crate::weights::{to_device_layout, Kind};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use kestrel_gguf::GgmlType;

/// A small xorshift generator: inputs differ per case, and a case can be rerun from its seed.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

/// One case's outcome.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub op: String,
    pub err: f64,
    pub tol: f64,
}

impl CaseResult {
    pub fn pass(&self) -> bool {
        self.err.is_finite() && self.err <= self.tol
    }
}

/// ‖a − b‖ / ‖b‖ (NaN anywhere fails).
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.iter().any(|v| !v.is_finite()) {
        return f64::NAN;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn ggml(kind: Kind) -> GgmlType {
    match kind {
        Kind::F32 => GgmlType::F32,
        Kind::F16 => GgmlType::F16,
        Kind::Q4_0 => GgmlType::Q4_0,
        Kind::Q5_0 => GgmlType::Q5_0,
        Kind::Q8_0 => GgmlType::Q8_0,
        Kind::Q4K => GgmlType::Q4_K,
        Kind::Q6K => GgmlType::Q6_K,
    }
}

/// A random matrix quantized to `kind`: (file bytes, the f32 values they decode to).
pub fn random_matrix(
    kind: Kind,
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> Result<(Vec<u8>, Vec<f32>)> {
    let ty = ggml(kind);
    let rb = kestrel_quant::row_bytes(ty, cols).map_err(|e| CudaError::Other(e.to_string()))?;
    let mut bytes = vec![0u8; rows * rb];
    let mut deq = vec![0f32; rows * cols];
    for r in 0..rows {
        let src = rng.vec(cols, 0.05);
        let dst = &mut bytes[r * rb..(r + 1) * rb];
        kestrel_quant::quantize_row(ty, &src, dst).map_err(|e| CudaError::Other(e.to_string()))?;
        kestrel_quant::dequantize_row(ty, dst, &mut deq[r * cols..(r + 1) * cols])
            .map_err(|e| CudaError::Other(e.to_string()))?;
    }
    Ok((bytes, deq))
}

fn bytes_i32(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

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

/// The fused q/k/v mat-vec: three matrices of different types in one launch.
pub fn check_mvx(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    let cols = 1536;
    for (kinds, nt) in [
        ([Kind::Q4K, Kind::Q4K, Kind::Q6K], 1usize),
        ([Kind::Q8_0, Kind::Q5_0, Kind::Q4_0], 4),
        ([Kind::F32, Kind::F16, Kind::F32], 2),
    ] {
        let rows = [512usize, 128, 128];
        let mats: Vec<(Vec<u8>, Vec<f32>)> = (0..3)
            .map(|i| random_matrix(kinds[i], rows[i], cols, rng))
            .collect::<Result<_>>()?;
        let devs: Vec<_> = (0..3)
            .map(|i| gpu.upload(&to_device_layout(kinds[i], &mats[i].0)))
            .collect::<Result<_>>()?;
        let outs: Vec<_> = (0..3)
            .map(|i| gpu.alloc(nt * rows[i] * 4))
            .collect::<Result<_>>()?;
        let x = rng.vec(nt * cols, 1.0);
        let dx = gpu.upload_f32(&x)?;
        let (dq, dd) = (gpu.alloc(nt * cols)?, gpu.alloc(nt * cols / 32 * 8)?);
        let qf = gpu.func("quantize_q")?;
        let n = cols as i32;
        let f = gpu.func(&format!("mvx_{}", nt.next_power_of_two()))?;
        let r: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let ty: Vec<i32> = kinds.iter().map(|&k| k as i32).collect();
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
                .arg(&devs[0].ptr)
                .arg(&r[0])
                .arg(&ty[0])
                .arg(&outs[0].ptr)
                .arg(&devs[1].ptr)
                .arg(&r[1])
                .arg(&ty[1])
                .arg(&outs[1].ptr)
                .arg(&devs[2].ptr)
                .arg(&r[2])
                .arg(&ty[2])
                .arg(&outs[2].ptr)
                .arg(&n)
                .arg(&dq.ptr)
                .arg(&dd.ptr)
                .arg(&dx.ptr)
                .launch(cfg((total.div_ceil(4) as u32, 1, 1), 128))?;
        }
        for i in 0..3 {
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
                    "fused q/k/v mat-vec, part {i}: {} [{}x{cols}] tokens {nt}",
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

/// Attention over a paged cache with a shuffled block table, split and combined, against a
/// plain f64 softmax over the same f16 values.
pub fn check_attention(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    let bs = 16usize;
    for (nh, nkv, hd, len, t, splits) in [
        (12usize, 2usize, 128usize, 1usize, 1usize, 32usize),
        (32, 8, 128, 5000, 1, 32),
        (12, 2, 128, 700, 4, 32),
        (4, 2, 16, 37, 37, 1),
        (32, 8, 128, 300, 300, 1),
        (8, 2, 64, 1000, 2, 32),
        (8, 4, 96, 333, 1, 32),
        (4, 4, 256, 70, 3, 32),
    ] {
        let kvd = nkv * hd;
        let n_blocks = len.div_ceil(bs) + 3;
        // a shuffled table: logical block i lives in physical block table[i]
        let mut table: Vec<i32> = (0..n_blocks as i32).collect();
        for i in (1..table.len()).rev() {
            table.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let rows_total = n_blocks * bs;
        let kc: Vec<half::f16> = rng
            .vec(rows_total * kvd, 1.0)
            .into_iter()
            .map(half::f16::from_f32)
            .collect();
        let vc: Vec<half::f16> = rng
            .vec(rows_total * kvd, 1.0)
            .into_iter()
            .map(half::f16::from_f32)
            .collect();
        let q = rng.vec(t * nh * hd, 1.0);
        // the last t tokens of a sequence of `len`
        let pos: Vec<i32> = (0..t).map(|i| (len - t + i) as i32).collect();
        let mut want = vec![0f32; t * nh * hd];
        let scale = 1.0 / (hd as f64).sqrt();
        for ti in 0..t {
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let n = pos[ti] as usize + 1;
                let row = |p: usize| table[p / bs] as usize * bs + p % bs;
                let s: Vec<f64> = (0..n)
                    .map(|p| {
                        (0..hd)
                            .map(|i| {
                                q[(ti * nh + h) * hd + i] as f64
                                    * kc[row(p) * kvd + kvh * hd + i].to_f64()
                            })
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for i in 0..hd {
                    want[(ti * nh + h) * hd + i] = ((0..n)
                        .map(|p| e[p] * vc[row(p) * kvd + kvh * hd + i].to_f64())
                        .sum::<f64>()
                        / z) as f32;
                }
            }
        }
        let h16 = |v: &[half::f16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (dk, dv, dqq) = (
            gpu.upload(&h16(&kc))?,
            gpu.upload(&h16(&vc))?,
            gpu.upload_f32(&q)?,
        );
        let (dpos, doff, dtab) = (
            gpu.upload(&bytes_i32(&pos))?,
            gpu.upload(&bytes_i32(&vec![0; t]))?,
            gpu.upload(&bytes_i32(&table))?,
        );
        let dpart = gpu.alloc(t * nh * splits * (hd + 2) * 4)?;
        let dout = gpu.alloc(t * nh * hd * 4)?;
        let (split, combine) = (
            gpu.func(&crate::ops::attn_kernel(hd))?,
            gpu.func("attn_combine")?,
        );
        let (a, b, c, bsi, ns, sc) = (
            nh as i32,
            nkv as i32,
            hd as i32,
            bs as i32,
            splits as i32,
            scale as f32,
        );
        let null = 0u64;
        // SAFETY: as in check_matvec.
        unsafe {
            gpu.stream
                .launch_builder(&split)
                .arg(&dqq.ptr)
                .arg(&a)
                .arg(&b)
                .arg(&c)
                .arg(&dk.ptr)
                .arg(&dv.ptr)
                .arg(&bsi)
                .arg(&dpos.ptr)
                .arg(&doff.ptr)
                .arg(&dtab.ptr)
                .arg(&ns)
                .arg(&sc)
                .arg(&dpart.ptr)
                .launch(cfg((nh as u32, t as u32, splits as u32), 128))?;
            gpu.stream
                .launch_builder(&combine)
                .arg(&dpart.ptr)
                .arg(&a)
                .arg(&c)
                .arg(&ns)
                .arg(&dout.ptr)
                .arg(&null)
                .arg(&null)
                .launch(cfg((t as u32, (nh * hd).div_ceil(256) as u32, 1), 256))?;
        }
        let got = gpu.read_f32(dout.ptr, t * nh * hd)?;
        out.push(CaseResult { op: format!("attention ({}) {nh}/{nkv} heads of {hd}, context {len}, {t} queries, {splits} splits", crate::ops::attn_kernel(hd)), err: rel_err(&got, &want), tol: 1e-4 });
    }
    Ok(())
}

/// Embedding rows and the f16 dequantization + cuBLAS GEMM of the prefill path.
pub fn check_gemm_embed(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    let (rows, cols, t) = (1024usize, 1536usize, 77usize);
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
        let dw = gpu.upload(&to_device_layout(kind, &file))?;
        let ids: Vec<u32> = (0..t).map(|_| (rng.next() % rows as u64) as u32).collect();
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
        let (tof, deq) = (gpu.func("to_f16")?, gpu.func("dequant_f16")?);
        let (n_x, r0, nr) = ((t * cols) as u64, 0i32, rows as i32);
        // SAFETY: as in check_matvec.
        unsafe {
            gpu.stream
                .launch_builder(&tof)
                .arg(&dx.ptr)
                .arg(&dx16.ptr)
                .arg(&n_x)
                .launch(cfg((n_x.div_ceil(256) as u32, 1, 1), 256))?;
            gpu.stream
                .launch_builder(&deq)
                .arg(&ty)
                .arg(&dw.ptr)
                .arg(&r)
                .arg(&c)
                .arg(&r0)
                .arg(&nr)
                .arg(&dw16.ptr)
                .launch(cfg(((rows * cols).div_ceil(256) as u32, 1, 1), 256))?;
        }
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

/// Runs every case; returns them (the caller prints and decides).
pub fn run_all(gpu: &mut Gpu, seed: u64) -> Result<Vec<CaseResult>> {
    gpu.bind()?;
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    check_matvec(gpu, &mut rng, &mut out)?;
    check_mvx(gpu, &mut rng, &mut out)?;
    check_norm(gpu, &mut rng, &mut out)?;
    check_epilogue(gpu, &mut rng, &mut out)?;
    check_attention(gpu, &mut rng, &mut out)?;
    check_gemm_embed(gpu, &mut rng, &mut out)?;
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_matches_the_cpu_on_a_gpu() {
        let mut gpu = match Gpu::open(0) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("skipped: no GPU here ({e})");
                return;
            }
        };
        let results = run_all(&mut gpu, 1).expect("harness ran");
        let failed: Vec<_> = results.iter().filter(|r| !r.pass()).collect();
        assert!(failed.is_empty(), "{failed:#?}");
    }

    #[test]
    fn rel_err_fails_on_nan() {
        assert!(rel_err(&[f32::NAN], &[1.0]).is_nan());
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    }
}
