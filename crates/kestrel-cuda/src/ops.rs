//! The CUDA backend's operations: [`kestrel_models::backend::Ops`] over the model's device
//! buffers. Every operation only enqueues kernels on the model's stream (no host sync, no
//! allocation), so a whole forward pass can be captured into a CUDA graph.
//!
//! Fusions the recipe does not see:
//! - RMSNorm writes the 8-bit activation blocks the next mat-vec reads (no separate pass);
//!   attention's combine step does the same for the output projection.
//! - Bias, q/k norm, RoPE and the KV write are recorded and run as one kernel
//!   (`qkv_epilogue`) when the next other operation arrives; one token of llama / qwen2 runs
//!   them in the q/k/v products' warps, with the norm before them (`deferred.rs`).
//! - The residual add is the mat-vec's epilogue (`matmul_add`), SwiGLU the gate/up mat-vec's.

use crate::device::Gpu;
use crate::error::{CudaError, Result};
pub use crate::matmul::{warps_per_row, MVX_MATS};
use crate::model::{AttnDev, CudaModel, DeltaNetDev, FfnDev, LayerDev, MixerDev, MlpDev};
use crate::moe::MoeDev;
use crate::weights::DevMatrix;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use kestrel_models::backend::{Buf, Ops, Param, W};
use kestrel_sampler::processors::greedy::argmax_logits;

/// Tokens up to which matmuls run as mat-vec kernels (and a step can be a CUDA graph).
pub const MATVEC_MAX: usize = 8;

/// Tokens up to which quantized matmuls take the int8 mat-mat kernel (`kernels/mmq.cu`, its own
/// 8-bit activation layout) instead of the f16 GEMM; a multiple of its 64-token tile.
pub const MMQ_MAX: usize = 64;

/// The CUDA-core decode attention kernel for a head size (`kernels/attention.cu`,
/// `attn_decode_h<HD>`): every head size the GPU takes.
pub fn attn_kernel(head_dim: usize) -> Result<String> {
    match head_dim {
        d if d % 16 == 0 && (16..=128).contains(&d) || d == 192 || d == 256 => {
            Ok(format!("attn_decode_h{d}"))
        }
        d => Err(CudaError::Unsupported(format!(
            "attention heads of {d} dims (multiples of 16 up to 128, 192 and 256 on the GPU)"
        ))),
    }
}

/// Blocks of the CUDA-core decode attention kernel per (token, context range): per KV head,
/// its query heads in groups of at most 4 (`kernels/attention.cu` splits them the same way).
fn attn_groups(n_heads: usize, n_kv: usize) -> usize {
    n_kv * (n_heads / n_kv).div_ceil(4)
}

/// Query heads a KV head may have for the tensor-core decode kernel (the mma's N).
const ATTN_MMA_HEADS: usize = 8;

/// K/V rows a step reads (over its tokens) from which decode attention takes the tensor cores.
const ATTN_MMA_MIN_POSITIONS: usize = 1024;

/// A model's decode attention kernel and its launch shape: the tensor-core one
/// (`kernels/flash.cu`, `attn_decode_mma_h{64,128,256}_s2`: a block per KV head with all its
/// query heads) for those head sizes and up to 8 query heads a KV head, where the device gives
/// a block its shared memory, else the CUDA-core one (a block per KV head and group of up to 4
/// of its query heads). Both take the same arguments and a grid of (blocks per token and
/// range, tokens, context ranges); a step takes the tensor-core one when it reads enough of
/// the cache ([`AttnDecode::pays`]).
/// `KESTREL_CUDA_ATTN_MMA=0` keeps the CUDA-core kernel everywhere (A/B figures).
#[derive(Clone, Debug, PartialEq)]
pub struct AttnDecode {
    pub name: String,
    /// Blocks per (token, context range).
    pub groups: usize,
    /// Dynamic shared memory a block, bytes.
    pub smem: u32,
}

impl AttnDecode {
    /// A model's decode attention kernels on a GPU giving a block up to `smem_per_block` bytes
    /// of shared memory: the CUDA-core one, and the tensor-core one where the heads take it,
    /// its shared memory fits and the switch is on.
    pub fn for_model(
        head_dim: usize,
        n_heads: usize,
        n_kv: usize,
        smem_per_block: usize,
    ) -> Result<(Self, Option<Self>)> {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let cores = Self::pick(head_dim, n_heads, n_kv, false)?;
        let on = switch_on(&ON, "KESTREL_CUDA_ATTN_MMA");
        let mma = Self::pick(head_dim, n_heads, n_kv, on)?;
        Ok(if mma == cores || mma.smem as usize > smem_per_block {
            (cores, None)
        } else {
            (cores, Some(mma))
        })
    }

    /// The kernel for these heads: the tensor-core one where it applies and `mma` allows it,
    /// else the CUDA-core one.
    pub fn pick(head_dim: usize, n_heads: usize, n_kv: usize, mma: bool) -> Result<Self> {
        let group = n_heads / n_kv.max(1);
        if mma && matches!(head_dim, 64 | 128 | 256) && group <= ATTN_MMA_HEADS {
            // kernels/flash.cu's AttnMma<HD, 2>::SMEM: the warps' rings of two K/V tiles, or
            // the merge's space after them
            let (ld, heads, splits, stages) = (head_dim + 8, ATTN_MMA_HEADS, 128, 2);
            let ring = 4 * stages * (2 * 16 * ld) * 2;
            let merge = (4 * heads * head_dim
                + heads * head_dim
                + 2 * 4 * heads
                + 2 * heads
                + 2 * heads * splits)
                * 4;
            return Ok(Self {
                name: format!("attn_decode_mma_h{head_dim}_s{stages}"),
                groups: n_kv,
                smem: ring.max(merge) as u32,
            });
        }
        Ok(Self {
            name: attn_kernel(head_dim)?,
            groups: attn_groups(n_heads, n_kv),
            smem: 0,
        })
    }

    /// The kernel, allowed the dynamic shared memory it takes (above the default 48 KiB).
    pub fn func(&self, gpu: &mut crate::device::Gpu) -> Result<cudarc::driver::CudaFunction> {
        gpu.func_with_smem(&self.name, self.smem)
    }

    /// Context ranges per token of a step of `t` tokens on a GPU of `sms` SMs holding
    /// `smem_per_sm` bytes of shared memory each.
    pub fn splits(&self, t: usize, sms: usize, smem_per_sm: usize) -> usize {
        if self.smem == 0 {
            return crate::scratch::decode_splits(t, self.groups);
        }
        // blocks an SM holds by shared memory (1 KiB of an SM's reserved per block)
        let per_sm = (smem_per_sm / (self.smem as usize + 1024)).max(1);
        crate::scratch::mma_decode_splits(t, self.groups, sms * per_sm)
    }

    /// Whether a step whose tokens read `positions` K/V rows in all takes the tensor-core
    /// kernel rather than the CUDA-core one: each of its blocks ends in a merge of its warps, which
    /// short contexts do not repay (Qwen2.5-1.5B tg128, contexts up to ~200: 930 tok/s with it
    /// against 1,000 without; 8B heads at 16384: 29.7 us against 41.4).
    pub fn pays(positions: usize) -> bool {
        positions >= ATTN_MMA_MIN_POSITIONS
    }

    /// The grid of a step of `t` tokens over `n_splits` context ranges.
    pub fn config(&self, t: usize, n_splits: usize) -> LaunchConfig {
        LaunchConfig {
            shared_mem_bytes: self.smem,
            ..cfg((self.groups as u32, t as u32, n_splits as u32), 128)
        }
    }
}

/// The prompt attention kernel on the tensor cores (`kernels/flash.cu`, 64 queries of one
/// sequence a block) for a head size, where there is one.
pub fn flash_kernel(head_dim: usize) -> Option<String> {
    matches!(head_dim, 64 | 128 | 256).then(|| format!("attn_prefill_h{head_dim}"))
}

/// Whether a step of `t` tokens over `n_seqs` sequences is a prompt step: past the mat-vecs'
/// size, its sequences bringing 16+ tokens each on average. Prompt steps take the kernels made
/// for many tokens of one sequence (the tensor-core attention, the chunked delta rule, the
/// convolution over token runs); decode and batched decode keep the one-token kernels.
pub fn prompt_step(t: usize, n_seqs: usize) -> bool {
    t > MATVEC_MAX && t >= 16 * n_seqs
}

/// Whether a step takes the prompt attention kernel: prompt steps, unless
/// `KESTREL_CUDA_FLASH=0` (A/B figures).
pub fn takes_flash(t: usize, n_seqs: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    prompt_step(t, n_seqs) && switch_on(&ON, "KESTREL_CUDA_FLASH")
}

/// Whether the A/B switch `var` is on: on unless set to `0`, read once per process into `cell`.
pub(crate) fn switch_on(cell: &'static std::sync::OnceLock<bool>, var: &str) -> bool {
    *cell.get_or_init(|| std::env::var(var).map_or(true, |v| v != "0"))
}

/// Parts of a logits row that the argmax kernels reduce separately (one block each) before
/// merging them: a row of 152k-248k floats is read by 32 blocks, not one.
pub const ARGMAX_PARTS: usize = 32;

/// Scratch bytes of the argmax per logits row: the parts' (value, index) pairs and the pick.
pub fn argmax_bytes_per_row() -> u64 {
    (ARGMAX_PARTS * 8 + 4) as u64
}

pub(crate) fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaModel {
    /// (device address, row width) of an activation buffer.
    pub(crate) fn buf(&self, b: Buf) -> (u64, usize) {
        let c = &self.config;
        let s = &self.scratch;
        match b {
            Buf::X => (s.x.ptr, c.dim),
            Buf::H => (s.h.ptr, c.dim),
            Buf::Q => (s.q.ptr, c.q_dim()),
            Buf::K => (s.k.ptr, c.kv_dim()),
            Buf::V => (s.v.ptr, c.kv_dim()),
            Buf::Att => (s.att.ptr, c.q_dim()),
            Buf::Ffn => (s.ffn.ptr, c.ffn_dim),
            Buf::Picked => (s.picked.ptr, c.dim),
            Buf::Logits => (s.logits.ptr, c.vocab_size),
            Buf::Gate => (s.gate.ptr, c.q_dim()),
            Buf::Mixed => (
                s.mixed.ptr,
                c.hybrid.as_ref().map_or(0, |h| h.conv_channels()),
            ),
            Buf::Conv => (
                s.conv.ptr,
                c.hybrid.as_ref().map_or(0, |h| h.conv_channels()),
            ),
            Buf::Z => (s.z.ptr, c.hybrid.as_ref().map_or(0, |h| h.value_dim())),
            Buf::Alpha => (s.alpha.ptr, c.hybrid.as_ref().map_or(0, |h| h.n_v_heads)),
            Buf::Beta => (s.beta.ptr, c.hybrid.as_ref().map_or(0, |h| h.n_v_heads)),
            Buf::Delta => (s.delta.ptr, c.hybrid.as_ref().map_or(0, |h| h.value_dim())),
            Buf::Router => (s.moe.router.ptr, c.moe.as_ref().map_or(0, |m| m.n_experts)),
            Buf::ExpertFfn => (
                s.moe.ffn.ptr,
                c.moe.as_ref().map_or(0, |m| m.expert_ffn_dim),
            ),
        }
    }

    pub(crate) fn layer(&self, l: usize) -> Result<&LayerDev> {
        self.weights
            .layers
            .get(l)
            .ok_or_else(|| CudaError::Other(format!("no layer {l}")))
    }

    fn attn(&self, l: usize) -> Result<&AttnDev> {
        match &self.layer(l)?.mixer {
            MixerDev::Attention(a) => Ok(a),
            MixerDev::DeltaNet(_) => Err(CudaError::Other(format!(
                "layer {l} is a DeltaNet layer where attention was expected"
            ))),
        }
    }

    fn mlp(&self, l: usize) -> Result<&MlpDev> {
        match &self.layer(l)?.ffn {
            FfnDev::Dense(m) => Ok(m),
            FfnDev::Moe(_) => Err(CudaError::Other(format!(
                "layer {l} has experts where a dense MLP was expected"
            ))),
        }
    }

    pub(crate) fn moe(&self, l: usize) -> Result<&MoeDev> {
        match &self.layer(l)?.ffn {
            FfnDev::Moe(m) => Ok(m),
            FfnDev::Dense(_) => Err(CudaError::Other(format!(
                "layer {l} has a dense MLP where experts were expected"
            ))),
        }
    }

    fn deltanet(&self, l: usize) -> Result<&DeltaNetDev> {
        match &self.layer(l)?.mixer {
            MixerDev::DeltaNet(d) => Ok(d),
            MixerDev::Attention(_) => Err(CudaError::Other(format!(
                "layer {l} is an attention layer where DeltaNet was expected"
            ))),
        }
    }

    /// Rows of a buffer in this step.
    pub(crate) fn rows(&self, b: Buf) -> usize {
        match b {
            Buf::Picked | Buf::Logits => self.step.n_out,
            Buf::ExpertFfn => self.step.t * self.config.moe.as_ref().map_or(1, |m| m.n_used),
            _ => self.step.t,
        }
    }

    /// Where a kernel that writes `b` also writes its int8 blocks for the next mat-vec (the
    /// scratch's `xq` / `xd`; null pointers when the step is too long for the mat-vecs or rows
    /// do not split into 32-wide blocks). The caller marks `q8_of` once it has launched.
    pub(crate) fn quantized_output(&self, b: Buf) -> (u64, u64) {
        let (_, n) = self.buf(b);
        if self.rows(b) <= MATVEC_MAX && n.is_multiple_of(32) {
            (self.scratch.xq.ptr, self.scratch.xd.ptr)
        } else {
            (0, 0)
        }
    }

    pub(crate) fn matrix(&self, w: W) -> Result<&DevMatrix> {
        let ws = &self.weights;
        let m = match w {
            W::Embed => &ws.embed,
            W::Output => ws.output.as_ref().unwrap_or(&ws.embed),
            W::Layer(l, p) => match p {
                Param::Wq => &self.attn(l)?.wq,
                Param::WqGate => self.attn(l)?.wgate.as_ref().ok_or_else(|| {
                    CudaError::Other(format!("layer {l}'s attention has no output gate"))
                })?,
                Param::Wk => &self.attn(l)?.wk,
                Param::Wv => &self.attn(l)?.wv,
                Param::Wo => &self.attn(l)?.wo,
                Param::SsmQkv => &self.deltanet(l)?.qkv,
                Param::SsmZ => &self.deltanet(l)?.z,
                Param::SsmAlpha => &self.deltanet(l)?.alpha,
                Param::SsmBeta => &self.deltanet(l)?.beta,
                Param::SsmOut => &self.deltanet(l)?.out,
                Param::Gate => &self.mlp(l)?.gate,
                Param::Up => &self.mlp(l)?.up,
                Param::Down => &self.mlp(l)?.down,
                Param::MoeRouter => &self.moe(l)?.router,
                Param::GateExps => &self.moe(l)?.gate,
                Param::UpExps => &self.moe(l)?.up,
                Param::DownExps => &self.moe(l)?.down,
                other => return Err(CudaError::Other(format!("{other:?} is not a matrix"))),
            },
            W::OutputNorm => return Err(CudaError::Other("output_norm is not a matrix".into())),
        };
        Ok(m)
    }

    /// Device address of a vector weight (norms, biases); 0 when the model has none.
    pub(crate) fn vector(&self, w: W) -> Result<u64> {
        let ws = &self.weights;
        Ok(match w {
            W::OutputNorm => ws.output_norm.ptr,
            W::Layer(l, p) => {
                let opt = |b: &Option<crate::device::DevBuf>| b.as_ref().map_or(0, |b| b.ptr);
                match p {
                    Param::AttnNorm => match &self.layer(l)?.mixer {
                        MixerDev::Attention(a) => a.norm.ptr,
                        MixerDev::DeltaNet(d) => d.norm.ptr,
                    },
                    Param::FfnNorm => self.layer(l)?.ffn_norm.ptr,
                    Param::BiasQ => opt(&self.attn(l)?.bias[0]),
                    Param::BiasK => opt(&self.attn(l)?.bias[1]),
                    Param::BiasV => opt(&self.attn(l)?.bias[2]),
                    Param::QNorm => opt(&self.attn(l)?.qk_norm[0]),
                    Param::KNorm => opt(&self.attn(l)?.qk_norm[1]),
                    Param::SsmConv => self.deltanet(l)?.conv_taps.ptr,
                    Param::SsmA => self.deltanet(l)?.a.ptr,
                    Param::SsmDtBias => self.deltanet(l)?.dt_bias.ptr,
                    Param::SsmNorm => self.deltanet(l)?.out_norm.ptr,
                    other => return Err(CudaError::Other(format!("{other:?} is not a vector"))),
                }
            }
            other => return Err(CudaError::Other(format!("{other:?} is not a vector"))),
        })
    }

    /// Marks `b` as rewritten: its 8-bit / f16 copies are stale.
    pub(crate) fn wrote(&mut self, b: Buf) {
        if self.step.q8_of == Some(b) {
            self.step.q8_of = None;
        }
        if self.step.q8t_of == Some(b) {
            self.step.q8t_of = None;
        }
        if self.step.f16_of == Some(b) {
            self.step.f16_of = None;
        }
    }

    /// Prompt attention by `kernel` (`kernels/flash.cu`): Q at `qp` into `op` ([t, q_dim]),
    /// one block per (64-query tile of a sequence, head).
    fn flash_attention(
        &mut self,
        layer: usize,
        kernel: &str,
        qp: u64,
        op: u64,
        out: Buf,
    ) -> Result<()> {
        let c = &self.config;
        let (nh, nkv) = (c.n_heads as i32, c.n_kv_heads as i32);
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let kvl = c.kv_layer(layer);
        let (kc, vc, bs) = (
            self.kv.k_layer(kvl),
            self.kv.v_layer(kvl),
            self.kv.block_size as i32,
        );
        let s = &self.scratch;
        let (pos, off, tables) = (s.pos.ptr, s.tbl_off.ptr, s.tables.ptr);
        let (t0, len) = (s.seq_t0.ptr, s.seq_len.ptr);
        let (t, n_seqs) = (self.step.t, self.step.n_seqs);
        let ns = n_seqs as i32;
        // every sequence's tiles fit in t / 64 + n_seqs; blocks past the last return
        let tiles = (t / 64 + n_seqs) as u32;
        let f = self.gpu.func(kernel)?;
        // SAFETY: as in flush; seq_t0 / seq_len hold n_seqs entries of this step.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&qp)
                .arg(&nh)
                .arg(&nkv)
                .arg(&kc)
                .arg(&vc)
                .arg(&bs)
                .arg(&pos)
                .arg(&off)
                .arg(&tables)
                .arg(&t0)
                .arg(&len)
                .arg(&ns)
                .arg(&scale)
                .arg(&op)
                .launch(cfg((tiles, c.n_heads as u32, 1), 128))?;
        }
        self.wrote(out);
        Ok(())
    }
}

impl Ops for CudaModel {
    type Error = CudaError;

    fn embed(&mut self, out: Buf) -> Result<()> {
        self.flush()?;
        let (op, _) = self.buf(out);
        let m = &self.weights.embed;
        let (ty, wp, r, c) = (m.kind as i32, m.buf.ptr, m.rows as i32, m.cols as i32);
        let ids = self.scratch.ids.ptr;
        let f = self.gpu.func("embed_rows")?;
        // SAFETY: as in flush.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&ty)
                .arg(&wp)
                .arg(&r)
                .arg(&c)
                .arg(&ids)
                .arg(&op)
                .launch(cfg((self.step.t as u32, 1, 1), 256))?;
        }
        self.wrote(out);
        Ok(())
    }

    fn rms_norm(&mut self, x: Buf, w: W, out: Buf) -> Result<()> {
        self.flush()?;
        let wp = self.vector(w)?;
        if self.rows(x) == 0 {
            return Ok(());
        }
        self.step.norm = Some(crate::deferred::PendingNorm { x, w: wp, out });
        if !(self.step.t == 1 && x != out && self.norm_foldable()) {
            self.flush_norm()?;
        }
        Ok(())
    }

    fn head_norm(&mut self, x: Buf, w: W) -> Result<()> {
        let wp = self.vector(w)?;
        match x {
            Buf::Q => self.record(2, |p| p.qn = wp),
            Buf::K => self.record(2, |p| p.kn = wp),
            other => Err(CudaError::Unsupported(format!("head_norm of {other:?}"))),
        }
    }

    fn add_bias(&mut self, x: Buf, b: W) -> Result<()> {
        let bp = self.vector(b)?;
        let i = match x {
            Buf::Q => 0,
            Buf::K => 1,
            Buf::V => 2,
            other => return Err(CudaError::Unsupported(format!("add_bias to {other:?}"))),
        };
        self.record(1, |p| p.bias[i] = bp)
    }

    fn matmul(&mut self, w: W, x: Buf, out: Buf) -> Result<()> {
        // matmuls over the same input wait to be launched together: up to four mat-vecs in one
        // launch, or the mat-mats of each weight type in one grid
        let (cols, t) = (self.buf(x).1, self.rows(x));
        let m = self.matrix(w)?;
        let fusable = (1..=MMQ_MAX).contains(&t)
            && (t <= MATVEC_MAX || crate::mmq::takes_mmq(m.kind, t))
            && m.cols == cols
            && m.rows == self.buf(out).1
            && matches!(
                out,
                Buf::Q | Buf::K | Buf::V | Buf::Gate | Buf::Mixed | Buf::Z | Buf::Alpha | Buf::Beta
            );
        if !fusable {
            return self.mm(w, None, x, out, false);
        }
        let int8 = m.kind.int8_activations();
        let same_kind_class = self.step.mm.iter().all(|&(w2, _)| {
            self.matrix(w2)
                .is_ok_and(|m2| m2.kind.int8_activations() == int8)
        });
        if self.step.mm_x != Some(x) || self.step.mm.len() == MVX_MATS || !same_kind_class {
            self.flush_mm()?;
        }
        if self.step.pending.stage > 0 {
            // the epilogue reads the deferred products: they run first (or with it)
            self.flush()?;
        }
        self.step.mm_x = Some(x);
        self.step.mm.push((w, out));
        Ok(())
    }

    fn matmul_add(&mut self, w: W, x: Buf, out: Buf) -> Result<()> {
        self.mm(w, None, x, out, true)
    }

    fn gate_up_swiglu(&mut self, gate: W, up: W, x: Buf, out: Buf) -> Result<()> {
        self.mm(gate, Some(up), x, out, false)
    }

    fn rope(&mut self, x: Buf) -> Result<()> {
        match x {
            // one epilogue kernel rotates q and k together
            Buf::Q | Buf::K => self.record(3, |p| p.rope = true),
            other => Err(CudaError::Unsupported(format!("rope of {other:?}"))),
        }
    }

    fn kv_write(&mut self, layer: usize, k: Buf, v: Buf) -> Result<()> {
        if (k, v) != (Buf::K, Buf::V) {
            return Err(CudaError::Unsupported(format!(
                "kv_write from {k:?}, {v:?}"
            )));
        }
        self.record(4, |p| p.kv_layer = Some(layer))
    }

    fn attention(&mut self, layer: usize, q: Buf, out: Buf) -> Result<()> {
        self.flush()?;
        let c = self.config.clone();
        let (qp, _) = self.buf(q);
        let (op, _) = self.buf(out);
        let t = self.step.t;
        if let Some(name) = flash_kernel(c.head_dim).filter(|_| takes_flash(t, self.step.n_seqs)) {
            return self.flash_attention(layer, &name, qp, op, out);
        }
        let n_splits = self.step.n_splits;
        let kernel = match (&self.attn_mma, self.step.attn_mma) {
            (Some(k), true) => k.clone(),
            _ => self.attn.clone(),
        };
        let f = kernel.func(&mut self.gpu)?;
        let (nh, nkv) = (c.n_heads as i32, c.n_kv_heads as i32);
        let kvl = c.kv_layer(layer);
        let (kc, vc, bs) = (
            self.kv.k_layer(kvl),
            self.kv.v_layer(kvl),
            self.kv.block_size as i32,
        );
        let s = &self.scratch;
        let (pos, off, tables) = (s.pos.ptr, s.tbl_off.ptr, s.tables.ptr);
        let (part, count) = (s.partial.ptr, s.attn_count.ptr);
        let (ns, scale) = (n_splits as i32, 1.0 / (c.head_dim as f32).sqrt());
        // the kernel quantizes whole heads for the output projection: 32-wide blocks
        let quant = t <= MATVEC_MAX && c.head_dim.is_multiple_of(32);
        let (xq, xd) = if quant { (s.xq.ptr, s.xd.ptr) } else { (0, 0) };
        // SAFETY: as in flush.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&qp)
                .arg(&nh)
                .arg(&nkv)
                .arg(&kc)
                .arg(&vc)
                .arg(&bs)
                .arg(&pos)
                .arg(&off)
                .arg(&tables)
                .arg(&ns)
                .arg(&scale)
                .arg(&part)
                .arg(&count)
                .arg(&op)
                .arg(&xq)
                .arg(&xd)
                .launch(kernel.config(t, n_splits))?;
        }
        self.wrote(out);
        if quant {
            self.step.q8_of = Some(out);
        }
        Ok(())
    }

    fn pick_rows(&mut self, x: Buf, out: Buf) -> Result<()> {
        self.flush()?;
        let (xp, n) = self.buf(x);
        let (op, _) = self.buf(out);
        let (idx, ni) = (self.scratch.pick.ptr, n as i32);
        let f = self.gpu.func("pick_rows")?;
        if self.step.n_out > 0 {
            // SAFETY: as in flush.
            unsafe {
                self.gpu
                    .stream
                    .launch_builder(&f)
                    .arg(&xp)
                    .arg(&idx)
                    .arg(&ni)
                    .arg(&op)
                    .launch(cfg((self.step.n_out as u32, 1, 1), 256))?;
            }
        }
        self.wrote(out);
        Ok(())
    }
}

/// The logits' way back to the host.
impl CudaModel {
    /// Brings a pass's `argmax.len()` logits rows to the host: the rows flagged in `argmax` as
    /// their argmax (picked on the GPU, pushed to `picks`; their floats in `out` left stale),
    /// the others whole (one copy per run of them, `None` in `picks`). `KESTREL_CUDA_ARGMAX=0`
    /// downloads every row whole and picks on the host (A/B figures).
    pub(crate) fn download_logits(
        &mut self,
        out: &mut [f32],
        argmax: &[bool],
        picks: &mut Vec<Option<u32>>,
    ) -> Result<()> {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let (rows, vocab) = (argmax.len(), self.config.vocab_size);
        if !argmax.contains(&true) {
            picks.extend(std::iter::repeat_n(None, rows));
            return self.gpu.read(self.scratch.logits.ptr, out);
        }
        if !switch_on(&ON, "KESTREL_CUDA_ARGMAX") {
            // the A/B's other side: every row whole, the picks made on the host
            self.gpu.read(self.scratch.logits.ptr, out)?;
            let host_argmax = |row: &[f32]| argmax_logits(row).unwrap_or(0);
            picks.extend(
                argmax
                    .iter()
                    .zip(out.chunks_exact(vocab))
                    .map(|(&a, row)| a.then(|| host_argmax(row))),
            );
            return Ok(());
        }
        let ids = self.argmax_rows(rows)?;
        for run in whole_row_runs(argmax) {
            let src = self.scratch.logits.ptr + (run.start * vocab * 4) as u64;
            self.gpu
                .read(src, &mut out[run.start * vocab..run.end * vocab])?;
        }
        picks.extend(argmax.iter().zip(ids).map(|(&a, id)| a.then_some(id)));
        Ok(())
    }

    /// The argmax of each of the first `rows` rows of the logits buffer.
    pub(crate) fn argmax_rows(&mut self, rows: usize) -> Result<Vec<u32>> {
        let part = self.scratch.argmax.ptr;
        let ids = part + (self.scratch.max_batch * ARGMAX_PARTS * 8) as u64;
        let n = self.config.vocab_size;
        launch_argmax(&mut self.gpu, self.scratch.logits.ptr, rows, n, part, ids)?;
        let mut got = vec![0i32; rows];
        self.gpu.read(ids, &mut got)?;
        Ok(got.into_iter().map(|i| i as u32).collect())
    }
}

/// The runs of consecutive rows not flagged in `argmax`: what downloads whole, one copy each.
fn whole_row_runs(argmax: &[bool]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    for run in argmax.chunk_by(|a, b| a == b) {
        if !run[0] {
            runs.push(start..start + run.len());
        }
        start += run.len();
    }
    runs
}

/// Launches the argmax of `rows` rows of `n` floats at `x` into `ids` (one i32 a row), with
/// `rows` x [`ARGMAX_PARTS`] (value, index) pairs of scratch at `part` (`kernels/elementwise.cu`:
/// `argmax_part`, `argmax_merge`).
pub fn launch_argmax(
    gpu: &mut Gpu,
    x: u64,
    rows: usize,
    n: usize,
    part: u64,
    ids: u64,
) -> Result<()> {
    let (parts, n) = (ARGMAX_PARTS as i32, n as i32);
    let (fp, fm) = (gpu.func("argmax_part")?, gpu.func("argmax_merge")?);
    // SAFETY: the callers' buffers: x holds rows x n floats, part rows x parts pairs, ids
    // rows ints.
    unsafe {
        gpu.stream
            .launch_builder(&fp)
            .arg(&x)
            .arg(&n)
            .arg(&part)
            .launch(cfg((ARGMAX_PARTS as u32, rows as u32, 1), 256))?;
        gpu.stream
            .launch_builder(&fm)
            .arg(&part)
            .arg(&parts)
            .arg(&ids)
            .launch(cfg((rows as u32, 1, 1), 32))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{whole_row_runs, AttnDecode};

    /// The tensor-core decode attention takes heads of 64 / 128 / 256 with up to 8 query heads
    /// a KV head, one block per KV head, within a block's shared memory (227 KiB on Hopper);
    /// the rest, and the switch off, take the CUDA-core kernel's grouping; short steps keep it.
    #[test]
    fn decode_attention_picks_the_tensor_cores_where_they_apply() {
        let mma = |hd, nh, nkv| AttnDecode::pick(hd, nh, nkv, true).unwrap();
        for (hd, nh, nkv) in [
            (128, 32, 8),
            (256, 16, 4),
            (64, 14, 2),
            (128, 12, 2),
            (256, 16, 2),
        ] {
            let k = mma(hd, nh, nkv);
            assert_eq!(k.name, format!("attn_decode_mma_h{hd}_s2"));
            assert_eq!(k.groups, nkv);
            assert!(k.smem > 0 && k.smem <= 227 << 10, "{k:?}");
        }
        // 12 query heads a KV head, 96-dim heads, the switch off: the CUDA-core kernel
        assert_eq!(mma(128, 24, 2).name, "attn_decode_h128");
        assert_eq!(mma(128, 24, 2).groups, 2 * 3);
        assert_eq!(mma(96, 8, 4).name, "attn_decode_h96");
        let off = AttnDecode::pick(128, 32, 8, false).unwrap();
        assert_eq!(
            (off.name.as_str(), off.groups, off.smem),
            ("attn_decode_h128", 8, 0)
        );
        assert!(AttnDecode::pick(100, 8, 4, true).is_err());
        // ranges: one wave of blocks, up to 32 (the 8B on 132 SMs: 3 blocks an SM)
        let hopper = 228 << 10;
        assert_eq!(mma(128, 32, 8).splits(1, 132, hopper), 32);
        assert_eq!(mma(128, 32, 8).splits(32, 132, hopper), 1);
        // a GPU giving a block 99 KiB (sm_86 / sm_89) keeps heads of 256 on the CUDA cores
        let on_99k = |hd, nh, nkv| AttnDecode::for_model(hd, nh, nkv, 99 << 10).unwrap().1;
        assert!(on_99k(256, 16, 4).is_none() && on_99k(128, 32, 8).is_some());
        assert!(!AttnDecode::pays(200) && AttnDecode::pays(1024));
    }

    #[test]
    fn whole_rows_download_in_runs_between_the_picked_ones() {
        let (t, f) = (true, false);
        assert!(whole_row_runs(&[t, t]).is_empty());
        assert_eq!(whole_row_runs(&[f, f, f]), vec![0..3]);
        assert_eq!(whole_row_runs(&[t, f, f, t, f]), vec![1..3, 4..5]);
        assert_eq!(whole_row_runs(&[f, t, t, f]), vec![0..1, 3..4]);
    }
}
