//! Attention over the paged f16 cache, against a plain f64 softmax over the same f16 values:
//! the decode kernels (`kernels/attention.cu` on the CUDA cores, and `kernels/flash.cu`'s on the
//! tensor cores where a shape takes it; context ranges merged by the last block) on a
//! sequence's last tokens, and the prompt kernel on the tensor cores (`kernels/flash.cu`) on steps of several
//! sequences (a prompt chunk resuming at a later position, a whole prompt, a lone decode
//! token), each with its own shuffled block table; and the prompt kernel's time against the
//! decode kernel's on a prompt chunk of the real shapes.

use super::{bytes_i32, cfg, rel_err, CaseResult, Rng};
use crate::device::{DevBuf, Gpu};
use crate::error::Result;
use crate::ops::AttnDecode;
use cudarc::driver::PushKernelArg;

const BS: usize = 16;

/// A step over a paged cache: per token its position and table offset, per sequence its
/// first token and count, and every sequence's blocks in one table.
struct Step {
    nh: usize,
    nkv: usize,
    hd: usize,
    pos: Vec<i32>,
    tbl_off: Vec<i32>,
    tables: Vec<i32>,
    seq_t0: Vec<i32>,
    seq_len: Vec<i32>,
    rows: usize,
}

impl Step {
    /// Sequences given as (context length after the step, tokens in the step); physical blocks
    /// handed out in a shuffled order.
    fn new(nh: usize, nkv: usize, hd: usize, seqs: &[(usize, usize)], rng: &mut Rng) -> Self {
        let total_blocks: usize = seqs.iter().map(|&(len, _)| len.div_ceil(BS)).sum();
        let mut phys: Vec<i32> = (0..total_blocks as i32).collect();
        for i in (1..phys.len()).rev() {
            phys.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut s = Step {
            nh,
            nkv,
            hd,
            pos: vec![],
            tbl_off: vec![],
            tables: vec![],
            seq_t0: vec![],
            seq_len: vec![],
            rows: total_blocks * BS,
        };
        for &(len, t) in seqs {
            let off = s.tables.len() as i32;
            let nb = len.div_ceil(BS);
            s.tables
                .extend_from_slice(&phys[off as usize..off as usize + nb]);
            s.seq_t0.push(s.pos.len() as i32);
            s.seq_len.push(t as i32);
            for i in 0..t {
                s.pos.push((len - t + i) as i32);
                s.tbl_off.push(off);
            }
        }
        s
    }

    fn t(&self) -> usize {
        self.pos.len()
    }

    /// Softmax(q k^T / sqrt(hd)) v of every token and head, in f64.
    fn reference(&self, q: &[f32], kc: &[half::f16], vc: &[half::f16]) -> Vec<f32> {
        let (nh, hd, kvd) = (self.nh, self.hd, self.nkv * self.hd);
        let scale = 1.0 / (hd as f64).sqrt();
        let mut want = vec![0f32; self.t() * nh * hd];
        for ti in 0..self.t() {
            let tbl = &self.tables[self.tbl_off[ti] as usize..];
            let row = |p: usize| tbl[p / BS] as usize * BS + p % BS;
            for h in 0..nh {
                let kvh = h / (nh / self.nkv);
                let n = self.pos[ti] as usize + 1;
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
        want
    }
}

/// The step's inputs on the device.
struct DevStep {
    q: DevBuf,
    kc: DevBuf,
    vc: DevBuf,
    pos: DevBuf,
    off: DevBuf,
    tables: DevBuf,
    t0: DevBuf,
    len: DevBuf,
    out: DevBuf,
}

fn upload(gpu: &Gpu, s: &Step, q: &[f32], kc: &[half::f16], vc: &[half::f16]) -> Result<DevStep> {
    let h16 = |v: &[half::f16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    Ok(DevStep {
        q: gpu.upload_f32(q)?,
        kc: gpu.upload(&h16(kc))?,
        vc: gpu.upload(&h16(vc))?,
        pos: gpu.upload(&bytes_i32(&s.pos))?,
        off: gpu.upload(&bytes_i32(&s.tbl_off))?,
        tables: gpu.upload(&bytes_i32(&s.tables))?,
        t0: gpu.upload(&bytes_i32(&s.seq_t0))?,
        len: gpu.upload(&bytes_i32(&s.seq_len))?,
        out: gpu.alloc(s.t() * s.nh * s.hd * 4)?,
    })
}

/// Enqueues the prompt kernel over the step, launched as `CudaModel` launches it.
fn launch_flash(gpu: &mut Gpu, s: &Step, d: &DevStep) -> Result<()> {
    let name = crate::ops::flash_kernel(s.hd).ok_or_else(|| {
        crate::error::CudaError::Unsupported(format!("no prompt kernel for head size {}", s.hd))
    })?;
    let f = gpu.func(&name)?;
    let (nh, nkv, bs, ns) = (s.nh as i32, s.nkv as i32, BS as i32, s.seq_len.len() as i32);
    let scale = 1.0 / (s.hd as f32).sqrt();
    let tiles = (s.t() / 64 + s.seq_len.len()) as u32;
    // SAFETY: every buffer is sized for the step it describes.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&d.q.ptr)
            .arg(&nh)
            .arg(&nkv)
            .arg(&d.kc.ptr)
            .arg(&d.vc.ptr)
            .arg(&bs)
            .arg(&d.pos.ptr)
            .arg(&d.off.ptr)
            .arg(&d.tables.ptr)
            .arg(&d.t0.ptr)
            .arg(&d.len.ptr)
            .arg(&ns)
            .arg(&scale)
            .arg(&d.out.ptr)
            .launch(cfg((tiles, s.nh as u32, 1), 128))?;
    }
    Ok(())
}

/// Enqueues a decode kernel over up to `splits` ranges of each context (one: what prompt
/// steps without the prompt kernel take), launched as `CudaModel` launches it; `quant` gets the
/// output's 8-bit blocks (xq, xd) when given.
fn launch_decode(
    gpu: &mut Gpu,
    kernel: &AttnDecode,
    s: &Step,
    d: &DevStep,
    scratch: &DecodeScratch,
    splits: usize,
    quant: Option<(u64, u64)>,
) -> Result<()> {
    let f = kernel.func(gpu)?;
    let (nh, nkv, bs, ns) = (s.nh as i32, s.nkv as i32, BS as i32, splits as i32);
    let scale = 1.0 / (s.hd as f32).sqrt();
    let (xq, xd) = quant.unwrap_or((0, 0));
    // SAFETY: as in launch_flash; scratch is sized for the step (DecodeScratch::new).
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&d.q.ptr)
            .arg(&nh)
            .arg(&nkv)
            .arg(&d.kc.ptr)
            .arg(&d.vc.ptr)
            .arg(&bs)
            .arg(&d.pos.ptr)
            .arg(&d.off.ptr)
            .arg(&d.tables.ptr)
            .arg(&ns)
            .arg(&scale)
            .arg(&scratch.partial.ptr)
            .arg(&scratch.count.ptr)
            .arg(&d.out.ptr)
            .arg(&xq)
            .arg(&xd)
            .launch(kernel.config(s.t(), splits))?;
    }
    Ok(())
}

/// The decode kernels for these heads: the CUDA-core one, and the tensor-core one where the
/// heads take it and its shared memory fits this GPU's blocks (as the model picks them).
fn decode_kernels(s: &Step, gpu: &Gpu) -> Result<Vec<AttnDecode>> {
    let mut ks = vec![AttnDecode::pick(s.hd, s.nh, s.nkv, false)?];
    let mma = AttnDecode::pick(s.hd, s.nh, s.nkv, true)?;
    if mma != ks[0] && mma.smem as usize <= gpu.smem_per_block {
        ks.push(mma);
    }
    Ok(ks)
}

/// The decode kernel's per-range results and its zeroed range counters.
struct DecodeScratch {
    partial: DevBuf,
    count: DevBuf,
}

impl DecodeScratch {
    fn new(gpu: &Gpu, s: &Step, splits: usize) -> Result<Self> {
        let counts = s.t() * s.nh;
        let count = gpu.alloc(counts * 4)?;
        gpu.write(count.ptr, &vec![0u8; counts * 4])?;
        Ok(Self {
            partial: gpu.alloc(s.t() * s.nh * splits * (s.hd + 4) * 4)?,
            count,
        })
    }
}

fn random_cache(s: &Step, rng: &mut Rng) -> (Vec<half::f16>, Vec<half::f16>, Vec<f32>) {
    let n = s.rows * s.nkv * s.hd;
    let mut f16s = |n: usize| -> Vec<half::f16> {
        rng.vec(n, 1.0)
            .into_iter()
            .map(half::f16::from_f32)
            .collect()
    };
    let (kc, vc) = (f16s(n), f16s(n));
    // q scaled so the softmax is peaked in places (scores up to ~±6), as trained models' are
    let q = rng.vec(s.t() * s.nh * s.hd, 2.0);
    (kc, vc, q)
}

/// The decode kernels on the last `t` tokens of one sequence of `len`, against the f64
/// reference; each case launched twice (the merging block must leave the range counters at
/// zero for the next step), with the output's 8-bit blocks checked where the model takes them.
pub fn check_attention(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    for (nh, nkv, hd, len, t, splits) in [
        (12usize, 2usize, 128usize, 1usize, 1usize, 64usize),
        (32, 8, 128, 5000, 1, 64),
        (32, 8, 128, 16384, 2, 64),
        (12, 2, 128, 700, 4, 64),
        (14, 2, 64, 3001, 3, 64),
        (4, 2, 16, 37, 37, 1),
        (32, 8, 128, 300, 300, 1),
        (8, 2, 64, 1000, 2, 64),
        (8, 4, 96, 333, 1, 64),
        (4, 4, 256, 70, 3, 64),
        (16, 4, 256, 9000, 1, 64),
        (40, 8, 128, 95, 8, 64),
        (6, 2, 48, 900, 2, 64),
        (10, 2, 80, 129, 4, 64),
        (8, 1, 192, 2000, 1, 64),
        (32, 8, 128, 3000, 6, 1),
        (32, 8, 128, 16384, 1, 128),
        (32, 8, 128, 2000, 32, 16),
        (64, 8, 128, 2500, 2, 64),
        (16, 2, 256, 777, 1, 64),
        (24, 2, 128, 1500, 1, 64),
    ] {
        let s = Step::new(nh, nkv, hd, &[(len, t)], rng);
        let (kc, vc, q) = random_cache(&s, rng);
        let want = s.reference(&q, &kc, &vc);
        let d = upload(gpu, &s, &q, &kc, &vc)?;
        let scratch = DecodeScratch::new(gpu, &s, splits)?;
        let n = t * nh * hd;
        let quant = (hd % 32 == 0 && t <= crate::ops::MATVEC_MAX)
            .then(|| Ok::<_, crate::error::CudaError>((gpu.alloc(n)?, gpu.alloc(n / 32 * 8)?)))
            .transpose()?;
        for kernel in decode_kernels(&s, gpu)? {
            let (mut err, mut qerr) = (0f64, 0f64);
            for _ in 0..2 {
                gpu.write(d.out.ptr, &vec![0xFFu8; n * 4])?;
                launch_decode(
                    gpu,
                    &kernel,
                    &s,
                    &d,
                    &scratch,
                    splits,
                    quant.as_ref().map(|(a, b)| (a.ptr, b.ptr)),
                )?;
                let got = gpu.read_f32(d.out.ptr, n)?;
                err = err.max(rel_err(&got, &want));
                if let Some((xq, xd)) = &quant {
                    qerr = qerr.max(quant_err(gpu, xq, xd, &got)?);
                }
            }
            let what = format!(
                "attention ({}) {nh}/{nkv} heads of {hd}, context {len}, {t} queries, up to {splits} ranges",
                kernel.name
            );
            if quant.is_some() {
                out.push(CaseResult {
                    op: format!("{what}: its 8-bit output blocks"),
                    err: qerr,
                    tol: 1e-3,
                });
            }
            // the tensor-core kernel rounds its queries and weights to f16 (as the prompt kernel)
            let tol = if kernel.smem > 0 { 5e-3 } else { 1e-4 };
            out.push(CaseResult { op: what, err, tol });
        }
    }
    Ok(())
}

/// How far the kernel's 8-bit blocks of the output are from the output it wrote: per value
/// the distance beyond rounding's half step, in steps, and the relative error of each block's
/// scale (amax / 127) and of its stored scaled sum.
fn quant_err(gpu: &Gpu, xq: &DevBuf, xd: &DevBuf, got: &[f32]) -> Result<f64> {
    let mut q = vec![0i8; got.len()];
    gpu.read(xq.ptr, &mut q)?;
    let ds = gpu.read_f32(xd.ptr, got.len() / 32 * 2)?;
    let mut worst = 0f64;
    for (c, block) in got.chunks(32).enumerate() {
        let (d, sum) = (ds[2 * c] as f64, ds[2 * c + 1] as f64);
        let amax = block.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
        let step = d.max(1e-30);
        let mut qsum = 0f64;
        for (i, &v) in block.iter().enumerate() {
            let qi = q[32 * c + i] as f64;
            qsum += qi;
            worst = worst.max(((qi * d - v as f64).abs() / step - 0.5).max(0.0));
        }
        worst = worst.max((d - amax / 127.0).abs() / step);
        worst = worst.max((sum - d * qsum).abs() / (step * 32.0));
    }
    Ok(worst)
}

/// A mixed step: heads, kv heads, head size, sequences as (context after the step, tokens in it).
type Case = (usize, usize, usize, &'static [(usize, usize)]);

/// The prompt kernel against the f64 reference on mixed steps of every head size it takes.
pub fn check_flash(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    // (heads, kv heads, head size, sequences as (context after the step, tokens in the step))
    let cases: [Case; 5] = [
        (32, 8, 128, &[(300, 300)]),
        (32, 8, 128, &[(1100, 130), (64, 64), (901, 1), (77, 77)]),
        (14, 2, 64, &[(515, 200), (9, 9), (200, 1)]),
        (8, 2, 256, &[(333, 333), (1000, 65)]),
        (4, 4, 128, &[(5000, 17)]),
    ];
    for (nh, nkv, hd, seqs) in cases {
        let s = Step::new(nh, nkv, hd, seqs, rng);
        let (kc, vc, q) = random_cache(&s, rng);
        let want = s.reference(&q, &kc, &vc);
        let d = upload(gpu, &s, &q, &kc, &vc)?;
        // poison the output: every stored row must be written
        gpu.write(d.out.ptr, &vec![0xFFu8; s.t() * nh * hd * 4])?;
        launch_flash(gpu, &s, &d)?;
        let got = gpu.read_f32(d.out.ptr, s.t() * nh * hd)?;
        out.push(CaseResult {
            op: format!("prompt attention (tensor cores) {nh}/{nkv} heads of {hd}, sequences (context, tokens) {seqs:?}"),
            err: rel_err(&got, &want),
            tol: 5e-3,
        });
    }
    Ok(())
}

/// (what, us, GB/s of K/V read): the decode kernels on one token at a long context of the real
/// shapes over 32 to 128 ranges, and on 32 sequences' tokens in one range each beside the
/// ranges the model gives them; mean of 20 after a warm-up.
pub fn perf_decode(gpu: &mut Gpu, rng: &mut Rng) -> Result<Vec<(String, f64, f64)>> {
    let (ns, batched) = (64, crate::model::decode_splits(32, 8));
    let (q3, q35, q25) = ("Qwen3-8B heads", "Qwen3.5-9B heads", "Qwen2.5-0.5B heads");
    let mut res = Vec::new();
    // (heads, KV heads, head size, context, tokens, ranges, what)
    for (nh, nkv, hd, len, t, splits, label) in [
        (32, 8, 128, 16384, 1, ns / 2, q3),
        (32, 8, 128, 16384, 1, 3 * ns / 4, q3),
        (32, 8, 128, 16384, 1, ns, q3),
        (32, 8, 128, 16384, 1, 2 * ns, q3),
        (32, 8, 128, 4096, 1, ns / 2, q3),
        (32, 8, 128, 4096, 1, 3 * ns / 4, q3),
        (32, 8, 128, 4096, 1, ns, q3),
        (32, 8, 128, 1024, 1, ns / 2, q3),
        (32, 8, 128, 1024, 1, ns, q3),
        (32, 8, 128, 4096, 8, 6, q3),
        (32, 8, 128, 4096, 32, 1, q3),
        (32, 8, 128, 4096, 32, batched, q3),
        (32, 8, 128, 256, 32, 1, q3),
        (32, 8, 128, 256, 32, batched, q3),
        (16, 4, 256, 16384, 1, ns / 2, q35),
        (16, 4, 256, 16384, 1, ns, q35),
        (16, 4, 256, 16384, 1, 2 * ns, q35),
        (14, 2, 64, 16384, 1, ns / 2, q25),
        (14, 2, 64, 16384, 1, ns, q25),
        (14, 2, 64, 16384, 1, 2 * ns, q25),
    ] {
        // t tokens: t sequences of `len` each (the batched decode step)
        let s = Step::new(nh, nkv, hd, &vec![(len, 1); t], rng);
        let (kc, vc, q) = random_cache(&s, rng);
        let d = upload(gpu, &s, &q, &kc, &vc)?;
        let scratch = DecodeScratch::new(gpu, &s, splits)?;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        for kernel in decode_kernels(&s, gpu)? {
            launch_decode(gpu, &kernel, &s, &d, &scratch, splits, None)?;
            let e0 = gpu.stream.record_event(timing)?;
            for _ in 0..20 {
                launch_decode(gpu, &kernel, &s, &d, &scratch, splits, None)?;
            }
            let e1 = gpu.stream.record_event(timing)?;
            e1.synchronize()?;
            let us = e0.elapsed_ms(&e1)? as f64 * 1e3 / 20.0;
            let bytes = (t * len * nkv * hd * 2 * 2) as f64;
            res.push((
                format!(
                    "{label} ({nh}/{nkv} of {hd}), {t} x context {len}, up to {splits} ranges, {}",
                    kernel.name
                ),
                us,
                bytes / us / 1e3,
            ));
        }
    }
    Ok(res)
}

/// (what, decode kernel us, prompt kernel us, TFLOP/s of the prompt kernel): one prompt chunk
/// of `t` tokens at the start of a sequence, mean of 5 after a warm-up.
pub fn perf_flash(gpu: &mut Gpu, rng: &mut Rng) -> Result<Vec<(String, f64, f64, f64)>> {
    let mut res = Vec::new();
    for (nh, nkv, hd, t, label) in [
        (32usize, 8usize, 128usize, 2048usize, "Qwen3-8B heads"),
        (8, 2, 256, 2048, "Qwen3.5-0.8B heads"),
        (14, 2, 64, 2048, "Qwen2.5-0.5B heads"),
    ] {
        let s = Step::new(nh, nkv, hd, &[(t, t)], rng);
        let (kc, vc, q) = random_cache(&s, rng);
        let d = upload(gpu, &s, &q, &kc, &vc)?;
        let scratch = DecodeScratch::new(gpu, &s, 1)?;
        let cuda_cores = AttnDecode::pick(hd, nh, nkv, false)?;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let time = |gpu: &mut Gpu, flash: bool| -> Result<f64> {
            let go = |gpu: &mut Gpu| {
                if flash {
                    launch_flash(gpu, &s, &d)
                } else {
                    launch_decode(gpu, &cuda_cores, &s, &d, &scratch, 1, None)
                }
            };
            go(gpu)?;
            let e0 = gpu.stream.record_event(timing)?;
            for _ in 0..5 {
                go(gpu)?;
            }
            let e1 = gpu.stream.record_event(timing)?;
            e1.synchronize()?;
            Ok(e0.elapsed_ms(&e1)? as f64 * 1e3 / 5.0)
        };
        let (split, flash) = (time(gpu, false)?, time(gpu, true)?);
        // causal: t (t + 1) / 2 scores per head, 4 hd flops each (q k and p v)
        let flops = (t * (t + 1) / 2 * nh * 4 * hd) as f64;
        res.push((
            format!("{label} ({nh}/{nkv} of {hd}), {t}-token prompt"),
            split,
            flash,
            flops / flash / 1e6,
        ));
    }
    Ok(res)
}
