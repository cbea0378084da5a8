//! The gated delta rule (`kernels/deltanet.cu`): the recurrent kernel of decode steps and the
//! chunked one of prompt steps, on one step of several sequences (a lone token among them),
//! each from a random state of its own slot, against the recurrence in f64: outputs and the
//! states left in the slots.

use super::{bytes_i32, cfg, rel_err, time_us, CaseResult, Rng};
use crate::device::Gpu;
use crate::error::Result;
use cudarc::driver::PushKernelArg;

/// One head layout: key heads, value heads, key and value head sizes, whether value head h
/// reads key head h % nk (tiled) or h / (nv / nk) (grouped).
struct Heads {
    nk: usize,
    nv: usize,
    dk: usize,
    dv: usize,
    tiled: bool,
}

/// The recurrence in f64 over each sequence: q and k L2-normalized (q also by 1/sqrt(dk)),
/// a = exp(A softplus(alpha + dt_bias)), beta = sigmoid(beta); S = a S + k (beta (v - a Sᵀk))ᵀ,
/// o = Sᵀq. `states` holds each slot's [nv, dk, dv] and is advanced in place.
#[allow(clippy::too_many_arguments)]
fn reference(
    h: &Heads,
    conv: &[f32],
    alpha: &[f32],
    beta: &[f32],
    a_log: &[f32],
    dt: &[f32],
    seqs: &[(usize, usize)],
    states: &mut [f64],
) -> Vec<f32> {
    let key_dim = h.nk * h.dk;
    let ch = 2 * key_dim + h.nv * h.dv;
    let per_slot = h.nv * h.dk * h.dv;
    let mut out = vec![0f32; conv.len() / ch * h.nv * h.dv];
    for (slot, &(t0, n)) in seqs.iter().enumerate() {
        for vh in 0..h.nv {
            let kh = if h.tiled {
                vh % h.nk
            } else {
                vh / (h.nv / h.nk)
            };
            let s = &mut states[slot * per_slot + vh * h.dk * h.dv..][..h.dk * h.dv];
            for t in t0..t0 + n {
                let row = &conv[t * ch..(t + 1) * ch];
                let norm =
                    |x: &[f32]| (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() + 1e-6).sqrt();
                let qr = &row[kh * h.dk..(kh + 1) * h.dk];
                let kr = &row[key_dim + kh * h.dk..key_dim + (kh + 1) * h.dk];
                let (nq, nk) = (norm(qr) * (h.dk as f64).sqrt(), norm(kr));
                let q: Vec<f64> = qr.iter().map(|&v| v as f64 / nq).collect();
                let k: Vec<f64> = kr.iter().map(|&v| v as f64 / nk).collect();
                let x = alpha[t * h.nv + vh] as f64 + dt[vh] as f64;
                let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
                let a = (a_log[vh] as f64 * sp).exp();
                let b = 1.0 / (1.0 + (-(beta[t * h.nv + vh] as f64)).exp());
                for j in 0..h.dv {
                    let v = row[2 * key_dim + vh * h.dv + j] as f64;
                    let kv: f64 = (0..h.dk).map(|r| s[r * h.dv + j] * k[r]).sum();
                    let d = b * (v - a * kv);
                    let mut o = 0.0;
                    for r in 0..h.dk {
                        s[r * h.dv + j] = s[r * h.dv + j] * a + k[r] * d;
                        o += s[r * h.dv + j] * q[r];
                    }
                    out[t * h.nv * h.dv + vh * h.dv + j] = o as f32;
                }
            }
        }
    }
    out
}

/// One step's device buffers for a rule kernel: the convolution output [t, ch], alpha and
/// beta [t, nv], A and dt_bias [nv], the output [t, nv * dv], the slots' states, and each
/// sequence's (first token, tokens, slot) arrays.
struct RuleStep {
    conv: u64,
    alpha: u64,
    beta: u64,
    a_log: u64,
    dt: u64,
    out: u64,
    states: u64,
    seq: (u64, u64, u64),
    n_seqs: usize,
}

/// Launches `kernel` ("delta_rule" or "delta_chunked") over `step` as hybrid_ops.rs does.
fn launch_rule(gpu: &mut Gpu, kernel: &str, h: &Heads, step: &RuleStep) -> Result<()> {
    let f = gpu.func(&format!("{kernel}_{}", h.dk))?;
    let key_dim = h.nk * h.dk;
    let (chi, kd, nv, nk, dv, tiled) = (
        (2 * key_dim + h.nv * h.dv) as i32,
        key_dim as i32,
        h.nv as i32,
        h.nk as i32,
        h.dv as i32,
        h.tiled as i32,
    );
    let (slot_floats, layer_off) = ((h.nv * h.dk * h.dv) as u64, 0u64);
    let threads = if kernel == "delta_rule" { 128 } else { 256 };
    let (t0, len, slot) = step.seq;
    // SAFETY: the caller sizes every buffer for the step it describes, slots 0..n_seqs.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&step.conv)
            .arg(&chi)
            .arg(&kd)
            .arg(&step.alpha)
            .arg(&step.beta)
            .arg(&step.a_log)
            .arg(&step.dt)
            .arg(&nv)
            .arg(&nk)
            .arg(&dv)
            .arg(&tiled)
            .arg(&step.out)
            .arg(&step.states)
            .arg(&slot_floats)
            .arg(&layer_off)
            .arg(&t0)
            .arg(&len)
            .arg(&slot)
            .launch(cfg(
                (step.n_seqs as u32, h.nv as u32, h.dv.div_ceil(32) as u32),
                threads,
            ))?;
    }
    Ok(())
}

/// The recurrent rule of one decode step (one token per sequence) at the Qwen3.5 shapes:
/// (what, us, GB/s of state read and written), mean of 50 launches in a graph.
pub fn perf_delta_rule(gpu: &mut Gpu, rng: &mut Rng) -> Result<Vec<(String, f64, f64)>> {
    let mut res = Vec::new();
    for (nk, nv, label) in [(16, 16, "Qwen3.5-0.8B"), (16, 32, "Qwen3.5-9B")] {
        let h = Heads {
            nk,
            nv,
            dk: 128,
            dv: 128,
            tiled: true,
        };
        for n_seqs in [1usize, 32] {
            let ch = 2 * nk * h.dk + nv * h.dv;
            let per_slot = nv * h.dk * h.dv;
            let conv = gpu.upload_f32(&rng.vec(n_seqs * ch, 1.0))?;
            let alpha = gpu.upload_f32(&rng.vec(n_seqs * nv, 1.0))?;
            let beta = gpu.upload_f32(&rng.vec(n_seqs * nv, 1.0))?;
            let a_log = gpu.upload_f32(&vec![-0.5; nv])?;
            let dt = gpu.upload_f32(&rng.vec(nv, 0.5))?;
            let out = gpu.alloc(n_seqs * nv * h.dv * 4)?;
            let states = gpu.upload_f32(&rng.vec(n_seqs * per_slot, 0.1))?;
            let t0: Vec<i32> = (0..n_seqs as i32).collect();
            let len = vec![1i32; n_seqs];
            let (d_t0, d_len, d_slot) = (
                gpu.upload(&bytes_i32(&t0))?,
                gpu.upload(&bytes_i32(&len))?,
                gpu.upload(&bytes_i32(&t0))?,
            );
            let step = RuleStep {
                conv: conv.ptr,
                alpha: alpha.ptr,
                beta: beta.ptr,
                a_log: a_log.ptr,
                dt: dt.ptr,
                out: out.ptr,
                states: states.ptr,
                seq: (d_t0.ptr, d_len.ptr, d_slot.ptr),
                n_seqs,
            };
            let us = time_us(gpu, 3, 50, true, |gpu, _| {
                launch_rule(gpu, "delta_rule", &h, &step)
            })?;
            let bytes = (2 * n_seqs * per_slot * 4) as f64;
            res.push((
                format!("{label} ({nk}/{nv} heads of 128), {n_seqs} sequence(s)"),
                us,
                bytes / us / 1e3,
            ));
        }
    }
    Ok(res)
}

pub fn check_deltanet(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    let layouts = [
        Heads {
            nk: 2,
            nv: 4,
            dk: 128,
            dv: 128,
            tiled: false,
        },
        Heads {
            nk: 2,
            nv: 4,
            dk: 128,
            dv: 128,
            tiled: true,
        },
        Heads {
            nk: 2,
            nv: 4,
            dk: 16,
            dv: 16,
            tiled: false,
        },
        Heads {
            nk: 1,
            nv: 2,
            dk: 64,
            dv: 48,
            tiled: false,
        },
    ];
    // (first token, tokens) of each sequence: chunks of 16 with a partial last one, a lone
    // token, a sequence shorter than a chunk
    let seqs = [(0usize, 37usize), (37, 1), (38, 100), (138, 5)];
    let t: usize = seqs.iter().map(|s| s.1).sum();
    for h in &layouts {
        let key_dim = h.nk * h.dk;
        let ch = 2 * key_dim + h.nv * h.dv;
        let per_slot = h.nv * h.dk * h.dv;
        let conv = rng.vec(t * ch, 1.0);
        let alpha = rng.vec(t * h.nv, 2.0);
        let beta = rng.vec(t * h.nv, 2.0);
        let a_log: Vec<f32> = rng
            .vec(h.nv, 1.0)
            .iter()
            .map(|x| -(x.abs() + 0.1))
            .collect();
        let dt = rng.vec(h.nv, 0.5);
        let state0 = rng.vec(seqs.len() * per_slot, 0.5);
        let mut want_state: Vec<f64> = state0.iter().map(|&x| x as f64).collect();
        let want = reference(h, &conv, &alpha, &beta, &a_log, &dt, &seqs, &mut want_state);
        let want_state: Vec<f32> = want_state.iter().map(|&x| x as f32).collect();
        let (d_conv, d_alpha, d_beta, d_a, d_dt) = (
            gpu.upload_f32(&conv)?,
            gpu.upload_f32(&alpha)?,
            gpu.upload_f32(&beta)?,
            gpu.upload_f32(&a_log)?,
            gpu.upload_f32(&dt)?,
        );
        let t0: Vec<i32> = seqs.iter().map(|s| s.0 as i32).collect();
        let len: Vec<i32> = seqs.iter().map(|s| s.1 as i32).collect();
        let slot: Vec<i32> = (0..seqs.len() as i32).collect();
        let (d_t0, d_len, d_slot) = (
            gpu.upload(&bytes_i32(&t0))?,
            gpu.upload(&bytes_i32(&len))?,
            gpu.upload(&bytes_i32(&slot))?,
        );
        for kernel in ["delta_rule", "delta_chunked"] {
            let d_state = gpu.upload_f32(&state0)?;
            let d_out = gpu.alloc(t * h.nv * h.dv * 4)?;
            let step = RuleStep {
                conv: d_conv.ptr,
                alpha: d_alpha.ptr,
                beta: d_beta.ptr,
                a_log: d_a.ptr,
                dt: d_dt.ptr,
                out: d_out.ptr,
                states: d_state.ptr,
                seq: (d_t0.ptr, d_len.ptr, d_slot.ptr),
                n_seqs: seqs.len(),
            };
            launch_rule(gpu, kernel, h, &step)?;
            let got = gpu.read_f32(d_out.ptr, t * h.nv * h.dv)?;
            let got_state = gpu.read_f32(d_state.ptr, seqs.len() * per_slot)?;
            let what = format!(
                "{kernel}_{} {}/{} heads ({}), dv {}, sequences (first, tokens) {seqs:?}",
                h.dk,
                h.nk,
                h.nv,
                if h.tiled { "tiled" } else { "grouped" },
                h.dv
            );
            out.push(CaseResult {
                op: format!("{what}: outputs"),
                err: rel_err(&got, &want),
                tol: 1e-4,
            });
            out.push(CaseResult {
                op: format!("{what}: states"),
                err: rel_err(&got_state, &want_state),
                tol: 1e-4,
            });
        }
    }
    Ok(())
}
