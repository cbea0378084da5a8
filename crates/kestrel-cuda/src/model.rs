//! A dense model (llama, qwen2, qwen3) on one GPU: its weights, its paged KV pool and its
//! activation buffers in device memory, and the forward pass of the shared recipe
//! ([`kestrel_models::backend::dense`]) run by [`crate::ops`]. Decode steps of up to
//! [`MATVEC_MAX`] tokens are captured once per shape into a CUDA graph and replayed.

use crate::deferred::{Pending, PendingNorm};
use crate::device::{DevBuf, Gpu};
use crate::error::{CudaError, Result};
use crate::moe::MoeDev;
use crate::ops::{AttnDecode, MATVEC_MAX, MMQ_MAX};
pub use crate::scratch::{decode_splits, Scratch, DECODE_SPLITS, STEP_SECTIONS};
use crate::weights::DevMatrix;
use cudarc::driver::sys;
use kestrel_models::backend::{dense, hybrid, moe, Buf};
use kestrel_models::layers::{Ffn, LayerWeights, Mixer};
use kestrel_models::weights::TensorStore;
use kestrel_models::{recipes, Arch, ModelConfig};
use std::collections::HashMap;

/// One layer's weights on the device: its mixer (attention, or a DeltaNet layer in hybrid
/// models), then its FFN: the SwiGLU MLP, or routed experts (Qwen3-MoE).
pub struct LayerDev {
    pub mixer: MixerDev,
    pub ffn_norm: DevBuf,
    pub ffn: FfnDev,
}

pub enum FfnDev {
    Dense(MlpDev),
    Moe(MoeDev),
}

pub struct MlpDev {
    pub gate: DevMatrix,
    pub up: DevMatrix,
    pub down: DevMatrix,
}

pub enum MixerDev {
    Attention(AttnDev),
    DeltaNet(DeltaNetDev),
}

pub struct AttnDev {
    pub norm: DevBuf, // (dim) f32
    /// (q_dim, dim): the query rows of attn_q
    pub wq: DevMatrix,
    /// Qwen3.5 (attn_q of (2 * q_dim, dim): per head the query rows, then the output gate's):
    /// the gate rows, split from the queries at load (`Param::WqGate`)
    pub wgate: Option<DevMatrix>,
    pub wk: DevMatrix,
    pub wv: DevMatrix,
    pub wo: DevMatrix,
    pub bias: [Option<DevBuf>; 3],    // q, k, v (Qwen2)
    pub qk_norm: [Option<DevBuf>; 2], // q, k (Qwen3, Qwen3.5)
}

/// A gated-DeltaNet layer (shapes in `kestrel_models::deltanet::DeltaNetWeights`).
pub struct DeltaNetDev {
    pub norm: DevBuf,
    pub qkv: DevMatrix,
    pub z: DevMatrix,
    pub alpha: DevMatrix,
    pub beta: DevMatrix,
    pub conv_taps: DevBuf, // (K, channels) f32
    pub a: DevBuf,
    pub dt_bias: DevBuf,
    pub out_norm: DevBuf,
    pub out: DevMatrix,
}

impl LayerDev {
    fn upload(gpu: &Gpu, cfg: &ModelConfig, l: &LayerWeights) -> Result<Self> {
        let m = |w| DevMatrix::upload(gpu, w);
        // Qwen3.5's attention: attn_q's rows alternate between queries and gates, a head each
        let gated = cfg.hybrid.is_some();
        let mixer = match &l.mixer {
            Mixer::Attention(a) => MixerDev::Attention(AttnDev {
                norm: gpu.upload_f32(&a.norm)?,
                wq: if gated {
                    DevMatrix::upload_part(gpu, &a.wq, cfg.head_dim, 2, 0)?
                } else {
                    m(&a.wq)?
                },
                wgate: if gated {
                    Some(DevMatrix::upload_part(gpu, &a.wq, cfg.head_dim, 2, 1)?)
                } else {
                    None
                },
                wk: m(&a.wk)?,
                wv: m(&a.wv)?,
                wo: m(&a.wo)?,
                bias: match &a.bias {
                    Some(b) => [
                        Some(gpu.upload_f32(&b.q)?),
                        Some(gpu.upload_f32(&b.k)?),
                        Some(gpu.upload_f32(&b.v)?),
                    ],
                    None => [None, None, None],
                },
                qk_norm: match &a.qk_norm {
                    Some(n) => [Some(gpu.upload_f32(&n.q)?), Some(gpu.upload_f32(&n.k)?)],
                    None => [None, None],
                },
            }),
            Mixer::DeltaNet(d) => MixerDev::DeltaNet(DeltaNetDev {
                norm: gpu.upload_f32(&d.norm)?,
                qkv: m(&d.qkv)?,
                z: m(&d.z)?,
                alpha: m(&d.alpha)?,
                beta: m(&d.beta)?,
                conv_taps: gpu.upload_f32(&d.conv_taps)?,
                a: gpu.upload_f32(&d.a)?,
                dt_bias: gpu.upload_f32(&d.dt_bias)?,
                out_norm: gpu.upload_f32(&d.out_norm)?,
                out: m(&d.out)?,
            }),
        };
        let (ffn_norm, ffn) = match &l.ffn {
            Ffn::Dense(mlp) => (
                gpu.upload_f32(&mlp.norm)?,
                FfnDev::Dense(MlpDev {
                    gate: m(&mlp.gate)?,
                    up: m(&mlp.up)?,
                    down: m(&mlp.down)?,
                }),
            ),
            Ffn::Moe(moe) => (
                gpu.upload_f32(&moe.norm)?,
                FfnDev::Moe(MoeDev::upload(gpu, moe)?),
            ),
        };
        Ok(Self {
            mixer,
            ffn_norm,
            ffn,
        })
    }

    /// Every matrix of the layer (expert stacks whole).
    pub fn matrices(&self) -> Vec<&DevMatrix> {
        self.matrices_read().into_iter().map(|(m, _)| m).collect()
    }

    /// The matrices the recipe's matmuls read (all but the expert stacks, which the mixture's
    /// own kernels read).
    pub fn products(&self) -> Vec<&DevMatrix> {
        let mut v = match &self.mixer {
            MixerDev::Attention(a) => {
                let mut v = vec![&a.wq, &a.wk, &a.wv, &a.wo];
                v.extend(&a.wgate);
                v
            }
            MixerDev::DeltaNet(d) => vec![&d.qkv, &d.z, &d.alpha, &d.beta, &d.out],
        };
        match &self.ffn {
            FfnDev::Dense(d) => v.extend([&d.gate, &d.up, &d.down]),
            FfnDev::Moe(e) => v.push(&e.router),
        }
        v
    }

    /// Every matrix of the layer with the share of it a token reads: 1, or for an expert stack
    /// `n_used / n_experts` (a token's routes, on average).
    pub fn matrices_read(&self) -> Vec<(&DevMatrix, f64)> {
        let mut v: Vec<(&DevMatrix, f64)> = self.products().into_iter().map(|m| (m, 1.0)).collect();
        if let FfnDev::Moe(e) = &self.ffn {
            let share = e.n_used as f64 / e.n_experts as f64;
            v.extend([(&e.gate, share), (&e.up, share), (&e.down, share)]);
        }
        v
    }
}

pub struct WeightsDev {
    pub layers: Vec<LayerDev>,
    pub embed: DevMatrix,
    /// None when tied to the embedding.
    pub output: Option<DevMatrix>,
    pub output_norm: DevBuf,
}

/// The recurrent state of a hybrid model in device memory: `n_slots` slots of `slot_floats`
/// f32 each, laid out as the CPU's `StatePool` (per DeltaNet layer: the convolution window,
/// then the state matrices).
pub struct StateDev {
    pub buf: DevBuf,
    pub n_slots: usize,
    pub slot_floats: usize,
    /// Floats of one layer's window, and of its window + state.
    pub conv_floats: usize,
    pub per_layer: usize,
    /// DeltaNet index of each layer (None for attention layers).
    pub recurrent_index: Vec<Option<usize>>,
}

impl StateDev {
    fn new(gpu: &Gpu, cfg: &ModelConfig, n_slots: usize) -> Result<Self> {
        let (conv_floats, ssm_floats) = cfg
            .hybrid
            .as_ref()
            .map_or((0, 0), |h| (h.conv_floats(), h.ssm_floats()));
        let mut next = 0;
        let recurrent_index = (0..cfg.n_layers)
            .map(|l| {
                cfg.is_recurrent(l).then(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect();
        let per_layer = conv_floats + ssm_floats;
        let slot_floats = next * per_layer;
        let n_slots = if slot_floats == 0 { 0 } else { n_slots.max(1) };
        let buf = gpu.alloc(n_slots * slot_floats * 4)?;
        Ok(Self {
            buf,
            n_slots,
            slot_floats,
            conv_floats,
            per_layer,
            recurrent_index,
        })
    }

    fn slot_ptr(&self, slot: usize) -> u64 {
        self.buf.ptr + (slot * self.slot_floats * 4) as u64
    }
}

/// The paged KV pool: for each layer that keeps K/V (all but the DeltaNet layers of hybrid
/// models), `n_blocks * block_size` rows of `kv_dim` f16, K and V.
pub struct KvDev {
    pub k: DevBuf,
    pub v: DevBuf,
    pub n_blocks: usize,
    pub block_size: usize,
    layer_bytes: usize,
    row_bytes: usize,
}

impl KvDev {
    pub fn bytes_for(cfg: &ModelConfig, n_blocks: usize, block_size: usize) -> u64 {
        2 * (cfg.n_kv_layers() * n_blocks * block_size * cfg.kv_dim() * 2) as u64
    }
    /// K of the `kv`-th layer that keeps K/V (`ModelConfig::kv_layer`).
    pub fn k_layer(&self, kv: usize) -> u64 {
        self.k.ptr + (kv * self.layer_bytes) as u64
    }
    pub fn v_layer(&self, kv: usize) -> u64 {
        self.v.ptr + (kv * self.layer_bytes) as u64
    }
}

/// Per-step state of the operations (host side).
#[derive(Default)]
pub struct StepState {
    pub t: usize,
    pub n_out: usize,
    pub n_splits: usize,
    /// Decode attention on the tensor cores (`CudaModel::attn_mma`) in this step.
    pub attn_mma: bool,
    /// Sequences of the step (the DeltaNet kernels run one block row per sequence).
    pub n_seqs: usize,
    pub q8_of: Option<Buf>,
    /// The buffer the mat-mat's 8-bit copy holds.
    pub q8t_of: Option<Buf>,
    pub f16_of: Option<Buf>,
    pub pending: Pending,
    /// Mat-vecs deferred to run as one launch, and their shared input.
    pub mm: Vec<(kestrel_models::backend::W, Buf)>,
    pub mm_x: Option<Buf>,
    /// An RMSNorm deferred until the products that read it (`deferred.rs`:
    /// `fold_qkv_epilogue` takes it into their kernel).
    pub norm: Option<PendingNorm>,
}

/// One sequence's share of a step (as the engine's `SeqStep`).
pub struct SeqIn<'a> {
    pub tokens: &'a [u32],
    pub start: usize,
    pub blocks: &'a [u32],
    pub want_logits: bool,
    /// Logits of every token, not only the last (parity checks, `kestrel logits`).
    pub all_logits: bool,
    /// Recurrent-state slot (hybrid models; ignored by the others).
    pub slot: u32,
    /// Only the argmax of the last token's logits is wanted (as the engine's `SeqStep`): the
    /// step computes it on the GPU and downloads it instead of the row.
    pub argmax_only: bool,
}

/// Which shared recipe the model runs.
#[derive(Clone, Copy)]
pub(crate) enum Recipe {
    Dense(dense::Family),
    Hybrid,
    Moe,
}

/// Rows of logits a step returns: one per sequence that wants them, one per token where it
/// wants them all.
pub fn out_rows(seqs: &[SeqIn]) -> usize {
    seqs.iter()
        .map(|s| match (s.want_logits, s.all_logits) {
            (_, true) => s.tokens.len(),
            (true, false) => usize::from(!s.tokens.is_empty()),
            (false, false) => 0,
        })
        .sum()
}

/// Where a step's passes leave their rows: the logits (`filled` floats written so far) and
/// one pick per row (see [`CudaModel::forward_into`]).
struct StepOut<'a> {
    logits: &'a mut [f32],
    filled: usize,
    picks: &'a mut Vec<Option<u32>>,
}

/// A step graph's shape: (tokens, rows of logits, sequences, attention on the tensor cores).
type GraphKey = (usize, usize, usize, bool);

/// The captured decode steps by shape.
struct Graphs(HashMap<GraphKey, crate::graph::StepGraph>);
// SAFETY: graphs are launched only by the model's owner, with the context bound (Gpu::bind).
unsafe impl Send for Graphs {}

pub struct CudaModel {
    pub config: ModelConfig,
    pub(crate) gpu: Gpu,
    pub(crate) weights: WeightsDev,
    pub(crate) kv: KvDev,
    pub(crate) scratch: Scratch,
    pub(crate) step: StepState,
    pub(crate) state: StateDev,
    pub(crate) recipe: Recipe,
    max_batch: usize,
    max_blocks_per_seq: usize,
    graphs: Graphs,
    /// Capture decode steps into CUDA graphs (default on; off for A/B checks).
    pub use_graphs: bool,
    /// Programmatic edges in the last captured graph (0: plain edges; see [`crate::graph`]).
    pub programmatic_edges: usize,
    /// The shape of the last replayed step graph ([`CudaModel::time_replays`]).
    last_replay: Option<GraphKey>,
    /// Every matmul of a batched decode step takes a kernel of kestrel's own (the int8 ones, or
    /// mat-vecs for small float matrices: `matmul::float_mat_vecs`), no cuBLAS call: such steps
    /// can be graphs.
    batched_graphs: bool,
    /// The decode attention kernels of the model's heads: on the CUDA cores, and on the tensor
    /// cores where the heads take it (steps that read enough of the cache).
    pub(crate) attn: AttnDecode,
    pub(crate) attn_mma: Option<AttnDecode>,
    pub weight_bytes: u64,
    /// `KESTREL_CUDA_TIMELINE`: a replayed step's kernels stamped ([`crate::timeline`]).
    timeline: Option<crate::timeline::Timeline>,
}

/// Sizes of a model on the GPU.
#[derive(Debug, Clone)]
pub struct GpuShape {
    pub n_blocks: usize,
    pub block_size: usize,
    pub max_batch: usize,
    /// Longest sequence, in tokens (sizes the block tables).
    pub max_context: usize,
    /// Recurrent-state slots (hybrid models: running sequences + snapshots; at least one is
    /// made for a hybrid model, none for the others).
    pub state_slots: usize,
}

/// A recipe's layer loader (from `kestrel_models::recipes`).
type LoadLayer = fn(
    &TensorStore,
    &ModelConfig,
    usize,
) -> std::result::Result<LayerWeights, kestrel_models::ModelError>;

impl CudaModel {
    /// Uploads the weights of `store` and allocates the KV pool and scratch.
    pub fn load(gpu: Gpu, cfg: ModelConfig, store: &TensorStore, shape: &GpuShape) -> Result<Self> {
        let (recipe, load_layer): (Recipe, LoadLayer) =
            match (cfg.arch, dense::Family::of(cfg.arch)) {
                (Arch::Qwen35, _) => (Recipe::Hybrid, recipes::qwen35::load_layer),
                (Arch::Llama, Some(f)) => (Recipe::Dense(f), recipes::llama::load_layer),
                (Arch::Qwen2, Some(f)) => (Recipe::Dense(f), recipes::qwen2::load_layer),
                (Arch::Qwen3, Some(f)) => (Recipe::Dense(f), recipes::qwen3::load_layer),
                (Arch::Qwen3Moe, _) => (Recipe::Moe, recipes::qwen3moe::load_layer),
                _ => {
                    return Err(CudaError::Unsupported(format!(
                        "the {} architecture (llama, qwen2, qwen3, qwen3moe and qwen35 only)",
                        cfg.arch.name()
                    )))
                }
            };
        if let Some(m) = &cfg.moe {
            crate::moe::check_config(m, shape.max_batch)?;
        }
        if let Some(h) = &cfg.hybrid {
            if ![16, 32, 64, 128].contains(&h.head_k_dim)
                || h.conv_kernel > 8
                || h.head_v_dim > 1024
            {
                return Err(CudaError::Unsupported(format!(
                    "DeltaNet layers with head_k_dim {} / conv_kernel {} (16-128 / up to 8 on the GPU)",
                    h.head_k_dim, h.conv_kernel
                )));
            }
        }
        let (attn, attn_mma) = AttnDecode::for_model(
            cfg.head_dim,
            cfg.n_heads,
            cfg.n_kv_heads,
            gpu.smem_per_block,
        )?;
        gpu.bind()?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        let mut weight_bytes = 0u64;
        for i in 0..cfg.n_layers {
            let d = LayerDev::upload(&gpu, &cfg, &load_layer(store, &cfg, i)?)?;
            weight_bytes += d.matrices().iter().map(|m| m.bytes() as u64).sum::<u64>();
            layers.push(d);
        }
        let embed = DevMatrix::upload(
            &gpu,
            &store.matrix("token_embd.weight", cfg.vocab_size, cfg.dim)?,
        )?;
        let output = if store.contains("output.weight") {
            Some(DevMatrix::upload(
                &gpu,
                &store.matrix("output.weight", cfg.vocab_size, cfg.dim)?,
            )?)
        } else {
            None
        };
        weight_bytes += embed.bytes() as u64 + output.as_ref().map_or(0, |o| o.bytes() as u64);
        let batched_graphs = layers
            .iter()
            .flat_map(|l| l.products())
            .chain([output.as_ref().unwrap_or(&embed)])
            .all(|m| m.kind.int8_activations() || crate::matmul::float_mat_vecs(m, MMQ_MAX));
        let output_norm = gpu.upload_f32(&recipes::output_norm(store, &cfg)?)?;
        let max_blocks_per_seq = shape.max_context.div_ceil(shape.block_size);
        let max_table = shape.max_batch.max(MATVEC_MAX) * max_blocks_per_seq;
        let scratch = Scratch::new(&gpu, &cfg, shape.max_batch, max_table)?;
        let row_bytes = cfg.kv_dim() * 2;
        let layer_bytes = shape.n_blocks * shape.block_size * row_bytes;
        let kv = KvDev {
            k: gpu.alloc(layer_bytes * cfg.n_kv_layers())?,
            v: gpu.alloc(layer_bytes * cfg.n_kv_layers())?,
            n_blocks: shape.n_blocks,
            block_size: shape.block_size,
            layer_bytes,
            row_bytes,
        };
        let state = StateDev::new(&gpu, &cfg, shape.state_slots)?;
        let timeline = crate::timeline::requested()
            .map(|path| crate::timeline::Timeline::new(&gpu, path))
            .transpose()?;
        gpu.stream.synchronize()?;
        Ok(Self {
            config: cfg,
            gpu,
            weights: WeightsDev {
                layers,
                embed,
                output,
                output_norm,
            },
            kv,
            scratch,
            step: StepState::default(),
            state,
            recipe,
            max_batch: shape.max_batch,
            max_blocks_per_seq,
            graphs: Graphs(HashMap::new()),
            use_graphs: true,
            programmatic_edges: 0,
            last_replay: None,
            batched_graphs,
            attn,
            attn_mma,
            weight_bytes,
            timeline,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Bytes of weights one decode step reads (every matrix, an expert stack by the share a
    /// token's routes read; one embedding row).
    pub fn weight_bytes_per_token(&self) -> u64 {
        let w = &self.weights;
        let mats: u64 = w
            .layers
            .iter()
            .flat_map(|l| l.matrices_read())
            .map(|(m, share)| (m.bytes() as f64 * share) as u64)
            .sum();
        mats + w.output.as_ref().unwrap_or(&w.embed).bytes() as u64
            + (w.embed.bytes() / w.embed.rows) as u64
    }

    /// Floating-point operations of the layers' matrix products per prompt token (2 per weight;
    /// the embedding row, the output head of the last token and attention's own products not
    /// counted): the work behind a prefill figure, against the tensor cores' peak.
    pub fn layer_matmul_flops_per_token(&self) -> u64 {
        self.weights
            .layers
            .iter()
            .flat_map(|l| l.matrices_read())
            .map(|(m, share)| (2.0 * (m.rows * m.cols) as f64 * share) as u64)
            .sum()
    }

    /// One step over the new tokens of several sequences; returns the logits of those that
    /// want them, in order. Steps over `max_batch` tokens are cut into several passes.
    pub fn forward(&mut self, seqs: &[SeqIn]) -> Result<Vec<f32>> {
        if seqs.iter().any(|s| s.argmax_only) {
            return Err(CudaError::Other(
                "forward returns whole rows: argmax_only steps take forward_argmax".into(),
            ));
        }
        let mut logits = vec![0.0; out_rows(seqs) * self.config.vocab_size];
        self.forward_into(seqs, &mut logits, &mut Vec::new())?;
        Ok(logits)
    }

    /// One step whose `argmax_only` sequences' next tokens (greedy decode) are returned, in
    /// order; the GPU picks them, and no logits row is downloaded for them.
    pub fn forward_argmax(&mut self, seqs: &[SeqIn]) -> Result<Vec<u32>> {
        let mut logits = vec![0.0; out_rows(seqs) * self.config.vocab_size];
        let mut picks = Vec::new();
        self.forward_into(seqs, &mut logits, &mut picks)?;
        Ok(picks.into_iter().flatten().collect())
    }

    /// As [`CudaModel::forward`], the logits written into `out`: [`out_rows`] x vocab floats
    /// (the engine's page-locked buffer, reused across steps), and one entry per row pushed to
    /// `picks`: the argmax of the rows of `argmax_only` sequences (their floats in `out` left
    /// stale), None for the others.
    pub fn forward_into(
        &mut self,
        seqs: &[SeqIn],
        out: &mut [f32],
        picks: &mut Vec<Option<u32>>,
    ) -> Result<()> {
        let n = out_rows(seqs) * self.config.vocab_size;
        if out.len() != n {
            return Err(CudaError::Other(format!(
                "a step's logits need {n} floats, the buffer has {}",
                out.len()
            )));
        }
        picks.clear();
        let mut out = StepOut {
            logits: out,
            filled: 0,
            picks,
        };
        self.forward_rows(seqs, &mut out)
    }

    fn forward_rows(&mut self, seqs: &[SeqIn], out: &mut StepOut) -> Result<()> {
        self.gpu.bind()?;
        let (vocab, bs) = (self.config.vocab_size, self.kv.block_size);
        for s in seqs {
            if let Some(&id) = s.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(kestrel_models::ModelError::BadToken { id, vocab }.into());
            }
            let end = s.start + s.tokens.len();
            if end > s.blocks.len() * bs || s.blocks.iter().any(|&b| b as usize >= self.kv.n_blocks)
            {
                return Err(kestrel_models::ModelError::ContextFull {
                    needed: end,
                    capacity: s.blocks.len() * bs,
                }
                .into());
            }
            if s.blocks.len() > self.max_blocks_per_seq {
                return Err(CudaError::Plan(format!(
                    "a sequence of {end} tokens is longer than the planned context"
                )));
            }
        }
        let total: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if total <= self.max_batch {
            return self.pass(seqs, out);
        }
        // Too many tokens for one pass: sequence by sequence, in chunks of max_batch.
        for s in seqs {
            let n = s.tokens.len();
            let mut i = 0;
            while i < n {
                let j = (i + self.max_batch).min(n);
                let part = SeqIn {
                    tokens: &s.tokens[i..j],
                    start: s.start + i,
                    blocks: s.blocks,
                    want_logits: s.want_logits && j == n,
                    all_logits: s.all_logits,
                    slot: s.slot,
                    argmax_only: s.argmax_only,
                };
                self.pass(&[part], out)?;
                i = j;
            }
        }
        Ok(())
    }

    /// One pass of at most `max_batch` tokens; its rows go to `out` after those already there.
    fn pass(&mut self, seqs: &[SeqIn], out: &mut StepOut) -> Result<()> {
        let bs = self.kv.block_size;
        let mut ids = Vec::new();
        let mut pos = Vec::new();
        let mut kv_row = Vec::new();
        let mut tbl_off = Vec::new();
        let mut tables: Vec<i32> = Vec::new();
        let mut pick = Vec::new();
        // per row of logits: whether its argmax alone goes back
        let mut argmax = Vec::new();
        let (mut seq_t0, mut seq_len, mut seq_slot) = (Vec::new(), Vec::new(), Vec::new());
        for s in seqs {
            if self.state.n_slots > 0 {
                if s.slot as usize >= self.state.n_slots {
                    return Err(CudaError::Plan(format!(
                        "recurrent-state slot {} of {}",
                        s.slot, self.state.n_slots
                    )));
                }
                if s.start == 0 {
                    self.clear_slot(s.slot as usize)?;
                }
            }
            seq_t0.push(ids.len() as u32);
            seq_len.push(s.tokens.len() as u32);
            seq_slot.push(s.slot);
            let off = tables.len() as i32;
            tables.extend(s.blocks.iter().map(|&b| b as i32));
            for (i, &tok) in s.tokens.iter().enumerate() {
                let p = s.start + i;
                ids.push(tok);
                pos.push(p as i32);
                kv_row.push((s.blocks[p / bs] as usize * bs + p % bs) as i32);
                tbl_off.push(off);
                if s.all_logits {
                    pick.push(ids.len() as i32 - 1);
                    argmax.push(false);
                }
            }
            if s.want_logits && !s.all_logits && !s.tokens.is_empty() {
                pick.push(ids.len() as i32 - 1);
                argmax.push(s.argmax_only);
            }
        }
        let t = ids.len();
        if t == 0 {
            return Ok(());
        }
        if tables.len() > self.scratch.tables_cap {
            return Err(CudaError::Plan(
                "block tables exceed the planned size".into(),
            ));
        }
        // one upload: STEP_SECTIONS sections of max_batch, then the tables
        let mb = self.scratch.max_batch;
        let mut host = vec![0u8; (STEP_SECTIONS * mb + tables.len()) * 4];
        let mut put = |section: usize, v: &mut dyn Iterator<Item = u32>| {
            for (i, x) in v.enumerate() {
                let at = (section * mb + i) * 4;
                host[at..at + 4].copy_from_slice(&x.to_le_bytes());
            }
        };
        put(0, &mut ids.iter().copied());
        put(1, &mut pos.iter().map(|&x| x as u32));
        put(2, &mut kv_row.iter().map(|&x| x as u32));
        put(3, &mut tbl_off.iter().map(|&x| x as u32));
        put(4, &mut pick.iter().map(|&x| x as u32));
        put(5, &mut seq_t0.iter().copied());
        put(6, &mut seq_len.iter().copied());
        put(7, &mut seq_slot.iter().copied());
        put(STEP_SECTIONS, &mut tables.iter().map(|&x| x as u32));
        self.gpu.write(self.scratch.step_in.ptr, &host)?;
        let n_out = pick.len();
        let n_seqs = seqs.len();
        let positions: usize = pos.iter().map(|&p| p as usize + 1).sum();
        let mma = self.attn_mma.is_some() && AttnDecode::pays(positions);
        self.step = self.step_state(t, n_out, n_seqs, mma);
        if self.use_graphs && self.graphable(t, n_seqs) {
            self.replay(t, n_out, n_seqs, mma)?;
        } else {
            self.run_recipe()?;
        }
        let (at, end) = (out.filled, out.filled + n_out * self.config.vocab_size);
        let rows = out
            .logits
            .get_mut(at..end)
            .ok_or_else(|| CudaError::Other("logits past the step's buffer".into()))?;
        out.filled = end;
        self.download_logits(rows, &argmax, out.picks)
    }

    fn run_recipe(&mut self) -> Result<()> {
        let cfg = self.config.clone();
        match self.recipe {
            Recipe::Dense(fam) => dense::forward(self, &cfg, fam)?,
            Recipe::Hybrid => hybrid::forward(self, &cfg)?,
            Recipe::Moe => moe::forward(self, &cfg)?,
        }
        self.flush()
    }

    /// Clears recurrent-state slot `slot` (the state before position 0), stream-ordered.
    fn clear_slot(&self, slot: usize) -> Result<()> {
        let bytes = self.state.slot_floats * 4;
        // SAFETY: the slot lies inside the state buffer (slot < n_slots, checked by callers).
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.state.slot_ptr(slot),
                0,
                bytes,
                self.gpu.stream.cu_stream(),
            )?;
        }
        Ok(())
    }

    /// Copies recurrent-state slot `src` into `dst` (a snapshot, or a resume from one).
    pub fn copy_state(&mut self, src: u32, dst: u32) -> Result<()> {
        let n = self.state.n_slots;
        if src == dst || src as usize >= n || dst as usize >= n {
            return Ok(());
        }
        self.gpu.bind()?;
        self.gpu.copy(
            self.state.slot_ptr(dst as usize),
            self.state.slot_ptr(src as usize),
            self.state.slot_floats * 4,
        )
    }

    /// Whether a step of `t` tokens over `n_seqs` sequences runs as a CUDA graph: every step of
    /// up to [`MATVEC_MAX`] tokens, and batched decode (one token per sequence) up to
    /// [`MMQ_MAX`] where no matmul of the step calls cuBLAS.
    fn graphable(&self, t: usize, n_seqs: usize) -> bool {
        t <= MATVEC_MAX || (t <= MMQ_MAX && t == n_seqs && self.batched_graphs)
    }

    /// A fresh step of `t` tokens (`n_out` rows of logits, `n_seqs` sequences), its decode
    /// attention on the tensor cores or not.
    fn step_state(&self, t: usize, n_out: usize, n_seqs: usize, mma: bool) -> StepState {
        let attn = match (&self.attn_mma, mma) {
            (Some(k), true) => k,
            _ => &self.attn,
        };
        StepState {
            t,
            n_out,
            n_splits: attn.splits(t, self.gpu.sms as usize, self.gpu.smem_per_sm),
            attn_mma: mma,
            n_seqs,
            ..StepState::default()
        }
    }

    /// Launches the graph of this step shape, capturing it first if it is new.
    fn replay(&mut self, t: usize, n_out: usize, n_seqs: usize, mma: bool) -> Result<()> {
        let key = (t, n_out, n_seqs, mma);
        self.last_replay = Some(key);
        if !self.graphs.0.contains_key(&key) {
            // load every kernel before capture (module calls are not captured)
            self.run_recipe()
                .map_err(|e| CudaError::Other(format!("decode step before capture: {e}")))?;
            self.step = self.step_state(t, n_out, n_seqs, mma);
            let stream = self.gpu.stream.clone();
            stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
            let r = self.run_recipe();
            let programmatic = crate::graph::programmatic_launch(&self.gpu);
            let g = crate::graph::end_capture(&self.gpu, &self.gpu.kernel_funcs(), programmatic);
            r.map_err(|e| CudaError::Other(format!("capturing the decode step: {e}")))?;
            let g =
                g.map_err(|e| CudaError::Other(format!("instantiating the decode graph: {e}")))?;
            self.programmatic_edges = g.programmatic_edges;
            self.graphs.0.insert(key, g);
            // the eager run above already computed this step
            return Ok(());
        }
        if let Some(g) = self.graphs.0.get(&key) {
            let due = self.timeline.as_mut().is_some_and(|tl| tl.due());
            match &mut self.timeline {
                Some(tl) if due => tl.record(&self.gpu, g)?,
                _ => g.launch(&self.gpu)?,
            }
        }
        Ok(())
    }

    /// Seconds the GPU takes for the last replayed step alone: its graph launched `n` times back
    /// to back with one wait after them, so no host work or copy lies between the replays
    /// (beside decode's time a token: the share of it the host and the step's copies take).
    /// The replays redo that step: the same K/V rows written again, but a recurrent state
    /// (Qwen3.5) advanced `n` more times, so its sequence must start over after. None before
    /// any replay.
    pub fn time_replays(&mut self, n: usize) -> Result<Option<f64>> {
        let Some(g) = self.last_replay.and_then(|k| self.graphs.0.get(&k)) else {
            return Ok(None);
        };
        self.gpu.stream.synchronize()?;
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            g.launch(&self.gpu)?;
        }
        self.gpu.stream.synchronize()?;
        Ok(Some(t0.elapsed().as_secs_f64() / n.max(1) as f64))
    }

    /// Copies the K/V of the first `n` positions of block `src` into block `dst`, every layer.
    pub fn copy_block(&mut self, src: u32, dst: u32, n: usize) -> Result<()> {
        self.gpu.bind()?;
        let rb = self.kv.row_bytes;
        let bs = self.kv.block_size;
        for l in 0..self.config.n_kv_layers() {
            for (base_of, _) in [
                (KvDev::k_layer as fn(&KvDev, usize) -> u64, 0),
                (KvDev::v_layer, 1),
            ] {
                let base = base_of(&self.kv, l);
                let s = base + (src as usize * bs * rb) as u64;
                let d = base + (dst as usize * bs * rb) as u64;
                self.gpu.copy(d, s, n.min(bs) * rb)?;
            }
        }
        Ok(())
    }

    pub fn kv_blocks(&self) -> usize {
        self.kv.n_blocks
    }

    pub fn block_size(&self) -> usize {
        self.kv.block_size
    }
}

impl kestrel_engine::StepModel for CudaModel {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn kv_blocks(&self) -> usize {
        self.kv.n_blocks
    }
    fn block_size(&self) -> usize {
        self.kv.block_size
    }
    fn forward(
        &mut self,
        seqs: &[kestrel_engine::SeqStep<'_>],
        logits: &mut kestrel_engine::Logits,
    ) -> std::result::Result<(), String> {
        let s: Vec<SeqIn> = seqs
            .iter()
            .map(|s| SeqIn {
                tokens: s.tokens,
                start: s.start,
                blocks: s.blocks,
                want_logits: s.want_logits,
                all_logits: s.all_logits,
                slot: s.slot,
                argmax_only: s.argmax_only && !s.all_logits,
            })
            .collect();
        let out = logits.fill(out_rows(&s) * self.config.vocab_size)?;
        let mut picks = Vec::new();
        CudaModel::forward_into(self, &s, out, &mut picks).map_err(|e| e.to_string())?;
        logits.set_picks(picks);
        Ok(())
    }
    fn logits_memory(&self) -> Option<Box<dyn kestrel_engine::LogitsMemory>> {
        Some(Box::new(crate::device::PinnedLogits::new(
            self.gpu.ctx.clone(),
        )))
    }
    fn state_slots(&self) -> usize {
        self.state.n_slots
    }
    fn copy_state(&mut self, src: u32, dst: u32) {
        // As copy_block: a failed device copy surfaces at the next forward.
        let _ = CudaModel::copy_state(self, src, dst);
    }
    fn copy_block(&mut self, src: u32, dst: u32, n_positions: usize) {
        // The trait has no error path; a failed device copy surfaces at the next forward.
        let _ = CudaModel::copy_block(self, src, dst, n_positions);
    }
}
