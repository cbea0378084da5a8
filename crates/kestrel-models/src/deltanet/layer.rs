//! A gated-DeltaNet layer (Qwen3.5's linear attention), from the residual stream back to it:
//!
//! ```text
//! h = rms_norm(x)
//! qkv = conv_silu(h W_qkv)        short causal convolution, window kept in the state slot
//! q, k = l2norm per head (q / sqrt(d_k)); v
//! beta = sigmoid(h W_beta);  g = A * softplus(h W_alpha + dt_bias),  A = -exp(A_log)
//! o = gated delta rule (chunked in prefill, recurrent in decode), state kept in the slot
//! x += W_out (rms_norm(o) * w * silu(h W_z))   per value head
//! ```

use super::conv::{conv_silu_channels, slide_window};
use super::rule::{self, HeadSeq};
use super::state::StatePool;
use super::DeltaNetConfig;
use crate::layers::{Ctx, SeqSpan};
use crate::ops;
use crate::pool::SharedMut;
use crate::tap::tap;
use crate::weights::{StoreFormat, TensorStore, Weight};
use crate::ModelError;

/// Tokens per convolution task (prefill runs split over the pool).
const CONV_ROWS: usize = 32;

/// Epsilon of the L2 normalization of q and k (as the reference implementations).
const L2_EPS: f32 = 1e-6;

pub struct DeltaNetWeights {
    pub norm: Vec<f32>,      // (dim): the layer's input norm
    pub qkv: Weight,         // (2 * key_dim + value_dim, dim)
    pub z: Weight,           // (value_dim, dim): the output gate
    pub alpha: Weight,       // (n_v_heads, dim): decay input
    pub beta: Weight,        // (n_v_heads, dim): update strength
    pub conv_taps: Vec<f32>, // (conv_kernel, conv channels), tap-major
    pub a: Vec<f32>,         // (n_v_heads): -exp(A_log)
    pub dt_bias: Vec<f32>,   // (n_v_heads)
    pub out_norm: Vec<f32>,  // (head_v_dim): the gated RMSNorm's weight
    pub out: Weight,         // (dim, value_dim)
}

impl DeltaNetWeights {
    /// The tensors of layer `i` (GGUF names; Hugging Face's are mapped onto them, with
    /// `A_log` as `ssm_a_log`). `norm` is the layer's input norm, already loaded.
    pub fn load(
        store: &TensorStore,
        h: &DeltaNetConfig,
        dim: usize,
        i: usize,
        norm: Vec<f32>,
    ) -> Result<Self, ModelError> {
        let n = |s: &str| format!("blk.{i}.{s}");
        let (nv, ch, k) = (h.n_v_heads, h.conv_channels(), h.conv_kernel);
        // (channels, K) in the file -> (K, channels)
        let taps = store.matrix(&n("ssm_conv1d.weight"), ch, k)?.to_f32()?;
        let mut conv_taps = vec![0f32; ch * k];
        for c in 0..ch {
            for j in 0..k {
                conv_taps[j * ch + c] = taps[c * k + j];
            }
        }
        let a = match store.format {
            StoreFormat::Gguf => store.vector(&n("ssm_a"), nv)?,
            StoreFormat::HuggingFace => store
                .vector(&n("ssm_a_log"), nv)?
                .iter()
                .map(|l| -l.exp())
                .collect(),
        };
        Ok(Self {
            norm,
            qkv: store.matrix(&n("attn_qkv.weight"), ch, dim)?,
            z: store.matrix(&n("attn_gate.weight"), h.value_dim(), dim)?,
            alpha: store.matrix(&n("ssm_alpha.weight"), nv, dim)?,
            beta: store.matrix(&n("ssm_beta.weight"), nv, dim)?,
            conv_taps,
            a,
            dt_bias: store.vector(&n("ssm_dt.bias"), nv)?,
            out_norm: store.vector(&n("ssm_norm.weight"), h.head_v_dim)?,
            out: store.matrix(&n("ssm_out.weight"), dim, h.value_dim())?,
        })
    }

    pub fn matrices_mut(&mut self) -> [&mut Weight; 5] {
        [
            &mut self.qkv,
            &mut self.z,
            &mut self.alpha,
            &mut self.beta,
            &mut self.out,
        ]
    }

    pub fn matrices(&self) -> [&Weight; 5] {
        [&self.qkv, &self.z, &self.alpha, &self.beta, &self.out]
    }
}

/// One pool thread's buffers for its (sequence, head) tasks: grown to the largest task seen,
/// then reused (no allocation per task).
#[derive(Default)]
struct TaskScratch {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    g: Vec<f64>,
    beta: Vec<f64>,
    out: Vec<f64>,
    rule: rule::Scratch,
}

impl TaskScratch {
    fn fit(&mut self, n: usize, dk: usize, dv: usize) {
        for (buf, len) in [
            (&mut self.q, n * dk),
            (&mut self.k, n * dk),
            (&mut self.v, n * dv),
            (&mut self.g, n),
            (&mut self.beta, n),
            (&mut self.out, n * dv),
        ] {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
        }
    }
}

thread_local! {
    static TASK_SCRATCH: std::cell::RefCell<TaskScratch> = Default::default();
}

/// `x *= 1 / sqrt(sum(x²) + eps) * scale`
fn l2_normalize(x: &mut [f32], scale: f32) {
    let sum: f32 = x.iter().map(|v| v * v).sum();
    let inv = scale / (sum + L2_EPS).sqrt();
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `ln(1 + e^x)`, linear above 20 as torch's softplus.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Runs DeltaNet layer `layer` (the `r`-th recurrent layer) over the batch and adds its
/// output to `x`. Each sequence of the batch reads and updates its own state slot.
pub fn forward(
    ctx: &Ctx,
    w: &DeltaNetWeights,
    h: &DeltaNetConfig,
    layer: usize,
    r: usize,
    states: &mut StatePool,
    x: &mut [f32],
) -> Result<(), ModelError> {
    let eps = ctx.cfg.rms_eps;
    let (nv, dk, dv) = (h.n_v_heads, h.head_k_dim, h.head_v_dim);
    let (key_dim, value_dim, ch) = (h.key_dim(), h.value_dim(), h.conv_channels());
    let t_len = ctx.t_len;

    // input norm and the four projections
    let mut hn = vec![0f32; x.len()];
    ops::rms_norm_into(x, &w.norm, eps, &mut hn);
    tap("attn_norm", layer, &hn);
    let [qkv, mut z, alpha, beta_in] = ctx.matmul_fused([&w.qkv, &w.z, &w.alpha, &w.beta], &hn)?;
    tap("linear_attn_qkv_mixed", layer, &qkv);

    // short convolution + SiLU, per sequence, through its window; long runs split over
    // token ranges on the pool, a single token (decode) over channel ranges (each task reads
    // the window, which slides afterwards)
    let mut conv = vec![0f32; t_len * ch];
    {
        let chan_parts = ctx.pool.n_threads().min(ch / 16).max(1);
        let parts: Vec<(usize, std::ops::Range<usize>, std::ops::Range<usize>)> = ctx
            .seqs
            .iter()
            .enumerate()
            .flat_map(|(si, s)| -> Vec<_> {
                if s.len == 1 {
                    let step = ch.div_ceil(chan_parts);
                    (0..ch)
                        .step_by(step)
                        .map(|lo| (si, 0..1, lo..(lo + step).min(ch)))
                        .collect()
                } else {
                    (0..s.len)
                        .step_by(CONV_ROWS.min(s.len).max(1))
                        .map(|a| (si, a..(a + CONV_ROWS).min(s.len), 0..ch))
                        .collect()
                }
            })
            .collect();
        let windows: Vec<&[f32]> = ctx.seqs.iter().map(|s| states.layer(s.slot, r).0).collect();
        let conv_ptr = SharedMut::new(&mut conv);
        let qkv_in = &qkv;
        ctx.pool.run(parts.len(), &|task| {
            let (si, rows, chans) = parts[task].clone();
            let s = &ctx.seqs[si];
            let x = &qkv_in[s.t0 * ch..(s.t0 + s.len) * ch];
            for t in rows {
                // SAFETY: each task writes only its own (token, channel range) of `conv`.
                let out = unsafe { conv_ptr.slice((s.t0 + t) * ch + chans.start, chans.len()) };
                conv_silu_channels(x, &w.conv_taps, ch, windows[si], out, t, chans.clone());
            }
        });
    }
    for s in ctx.seqs {
        let (window, _) = states.layer_mut(s.slot, r);
        slide_window(&qkv[s.t0 * ch..(s.t0 + s.len) * ch], ch, window);
    }
    tap("conv_output_silu", layer, &conv);

    // per token: q, k L2-normalized (q scaled), beta and the log decay g per value head
    let q_scale = 1.0 / (dk as f32).sqrt();
    let mut beta = vec![0f32; t_len * nv];
    let mut g = vec![0f32; t_len * nv];
    for t in 0..t_len {
        let row = &mut conv[t * ch..(t + 1) * ch];
        for head in row[..key_dim].chunks_exact_mut(dk) {
            l2_normalize(head, q_scale);
        }
        for head in row[key_dim..2 * key_dim].chunks_exact_mut(dk) {
            l2_normalize(head, 1.0);
        }
        for j in 0..nv {
            beta[t * nv + j] = 1.0 / (1.0 + (-beta_in[t * nv + j]).exp());
            g[t * nv + j] = w.a[j] * softplus(alpha[t * nv + j] + w.dt_bias[j]);
        }
    }

    // the delta rule, one task per (sequence, value head)
    let mut o = vec![0f32; t_len * value_dim];
    let states_ptr: Vec<SharedMut<f32>> = ctx
        .seqs
        .iter()
        .map(|s| SharedMut::new(states.layer_mut(s.slot, r).1))
        .collect();
    let o_ptr = SharedMut::new(&mut o);
    let conv = &conv;
    let (beta, g) = (&beta, &g);
    let n_tasks = ctx.seqs.len() * nv;
    ctx.pool.run(n_tasks, &|task| {
        let (si, vh) = (task / nv, task % nv);
        let s: &SeqSpan = &ctx.seqs[si];
        let kh = h.k_head_of(vh);
        let n = s.len;
        TASK_SCRATCH.with_borrow_mut(|ts| {
            ts.fit(n, dk, dv);
            let TaskScratch {
                q,
                k,
                v,
                g: gh,
                beta: bh,
                out,
                rule,
            } = ts;
            // gather this head's rows (in f64, see rule's module doc)
            let widen = |dst: &mut [f64], src: &[f32]| {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = s as f64;
                }
            };
            for i in 0..n {
                let t = s.t0 + i;
                let row = &conv[t * ch..(t + 1) * ch];
                widen(&mut q[i * dk..(i + 1) * dk], &row[kh * dk..(kh + 1) * dk]);
                let ko = key_dim + kh * dk;
                widen(&mut k[i * dk..(i + 1) * dk], &row[ko..ko + dk]);
                let vo = 2 * key_dim + vh * dv;
                widen(&mut v[i * dv..(i + 1) * dv], &row[vo..vo + dv]);
                gh[i] = g[t * nv + vh] as f64;
                bh[i] = beta[t * nv + vh] as f64;
            }
            let seq = HeadSeq {
                q: &q[..n * dk],
                k: &k[..n * dk],
                v: &v[..n * dv],
                g: &gh[..n],
                beta: &bh[..n],
            };
            // SAFETY: head `vh` of slot `s.slot` belongs to this task only (slots of one step
            // are distinct sequences').
            let state = unsafe { states_ptr[si].slice(vh * dk * dv, dk * dv) };
            let out = &mut out[..n * dv];
            if n == 1 {
                rule::recurrent_step(&seq, dk, dv, state, out);
            } else {
                rule::chunked_with(&seq, dk, dv, state, out, rule);
            }
            for i in 0..n {
                let at = (s.t0 + i) * value_dim + vh * dv;
                // SAFETY: (token, head vh) of this sequence is written by this task only.
                let dst = unsafe { o_ptr.slice(at, dv) };
                for (d, &s) in dst.iter_mut().zip(&out[i * dv..(i + 1) * dv]) {
                    *d = s as f32;
                }
            }
        });
    });
    tap("attn_output", layer, &o);

    // gated RMSNorm per value head: silu(z) * norm(o) * w, into z (16 lanes of exp at a time)
    for (oh, zh) in o.chunks_exact_mut(dv).zip(z.chunks_exact_mut(dv)) {
        ops::rms_norm(oh, &w.out_norm, eps);
        crate::vexp::swiglu_row(zh, oh);
    }
    tap("final_output", layer, &z);
    let y = ctx.matmul(&w.out, &z)?;
    tap("linear_attn_out", layer, &y);
    ops::add_in_place(x, &y);
    tap("ffn_inp", layer, x);
    Ok(())
}
