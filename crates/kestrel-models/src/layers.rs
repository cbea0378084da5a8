//! The building blocks the recipes are written in: weights of an attention block and an MLP,
//! and the steps over them. A recipe is the order of these steps plus what makes its family
//! different (biases, q/k norms).

use crate::attention::causal_attention;
use crate::attention::TokenKv;
use crate::config::ModelConfig;
use crate::deltanet::DeltaNetWeights;
use crate::kv::KvPool;
use crate::moe::MoeWeights;
use crate::ops::{self, MatmulPath, Rope};
use crate::pool::ThreadPool;
use crate::tap::tap;
use crate::weights::{TensorStore, Weight};
use crate::ModelError;

/// Everything one forward call shares across layers.
pub struct Ctx<'a> {
    pub cfg: &'a ModelConfig,
    pub pool: &'a ThreadPool,
    pub path: MatmulPath,
    pub rope: &'a Rope,
    /// Tokens in this batch (from one or several sequences).
    pub t_len: usize,
    /// Per token: its position and its sequence's block table.
    pub tokens: &'a [TokenKv<'a>],
    /// Per token: the pool row its K/V go to.
    pub rows: &'a [usize],
    /// The sequences of the batch, in order: where their tokens lie and their state slots.
    pub seqs: &'a [SeqSpan],
}

/// One sequence's tokens within a batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqSpan {
    /// First row of the batch that belongs to this sequence, and how many do.
    pub t0: usize,
    pub len: usize,
    /// Position of its first token.
    pub start: usize,
    /// Its recurrent-state slot (hybrid models).
    pub slot: usize,
}

impl Ctx<'_> {
    /// `x: [T, w.cols] -> [T, w.rows]`
    pub fn matmul(&self, w: &Weight, x: &[f32]) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0f32; self.t_len * w.rows];
        ops::matmul(self.pool, self.path, w, x, &mut out)?;
        Ok(out)
    }

    /// Several matrices over the same input, as one pool job where they allow it.
    pub fn matmul_fused<const N: usize>(
        &self,
        ws: [&Weight; N],
        x: &[f32],
    ) -> Result<[Vec<f32>; N], ModelError> {
        let mut outs: [Vec<f32>; N] = std::array::from_fn(|i| vec![0f32; self.t_len * ws[i].rows]);
        let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        ops::matmul_fused(self.pool, self.path, &ws, x, &mut slices)?;
        Ok(outs)
    }
}

pub struct AttnWeights {
    pub norm: Vec<f32>, // (dim)
    pub wq: Weight,     // (n_heads * head_dim, dim)
    pub wk: Weight,     // (n_kv_heads * head_dim, dim)
    pub wv: Weight,     // (n_kv_heads * head_dim, dim)
    pub wo: Weight,     // (dim, n_heads * head_dim)
    pub bias: Option<QkvBias>,
    pub qk_norm: Option<QkNorm>,
}

/// Biases of the q/k/v projections (Qwen2).
pub struct QkvBias {
    pub q: Vec<f32>, // (n_heads * head_dim)
    pub k: Vec<f32>, // (n_kv_heads * head_dim)
    pub v: Vec<f32>, // (n_kv_heads * head_dim)
}

/// RMSNorm over each head of q and k before RoPE (Qwen3).
pub struct QkNorm {
    pub q: Vec<f32>, // (head_dim)
    pub k: Vec<f32>, // (head_dim)
}

pub struct MlpWeights {
    pub norm: Vec<f32>, // (dim)
    pub gate: Weight,   // (ffn_dim, dim)
    pub up: Weight,     // (ffn_dim, dim)
    pub down: Weight,   // (dim, ffn_dim)
}

/// What mixes information across positions in a layer.
pub enum Mixer {
    /// Softmax attention over the KV cache.
    Attention(AttnWeights),
    /// Gated DeltaNet over a recurrent state (hybrid models).
    DeltaNet(DeltaNetWeights),
}

/// What transforms each position on its own after the mixer.
// one a layer: the dense variant's size costs nothing, and boxing it would add a hop a token
#[allow(clippy::large_enum_variant)]
pub enum Ffn {
    /// One SwiGLU MLP for every token.
    Dense(MlpWeights),
    /// A router and its experts (Qwen3-MoE): each token through the few it is routed to.
    Moe(MoeWeights),
}

impl Ffn {
    fn matrices_mut(&mut self) -> Vec<&mut Weight> {
        match self {
            Ffn::Dense(m) => vec![&mut m.gate, &mut m.up, &mut m.down],
            Ffn::Moe(m) => m.matrices_mut(),
        }
    }

    fn matrices(&self) -> Vec<&Weight> {
        match self {
            Ffn::Dense(m) => vec![&m.gate, &m.up, &m.down],
            Ffn::Moe(m) => m.matrices(),
        }
    }

    /// Weight bytes one token reads: all of a dense MLP; the router and `n_used` experts'
    /// share (the average expert's bytes) of a mixture.
    fn bytes_per_token(&self) -> u64 {
        match self {
            Ffn::Dense(_) => self.matrices().iter().map(|w| w.bytes().len() as u64).sum(),
            Ffn::Moe(m) => m.bytes_per_token(),
        }
    }
}

/// `x += ffn(norm(x))`, dense or routed.
pub fn ffn(ctx: &Ctx, f: &Ffn, layer: usize, x: &mut [f32]) -> Result<(), ModelError> {
    match f {
        Ffn::Dense(m) => mlp(ctx, m, layer, x),
        Ffn::Moe(m) => crate::moe::forward(ctx, m, layer, x),
    }
}

pub struct LayerWeights {
    pub mixer: Mixer,
    pub ffn: Ffn,
}

impl LayerWeights {
    /// The attention block of an attention layer (every layer of llama, qwen2, qwen3).
    pub fn attention(&self, i: usize) -> Result<&AttnWeights, ModelError> {
        match &self.mixer {
            Mixer::Attention(a) => Ok(a),
            Mixer::DeltaNet(_) => Err(ModelError::BadParam {
                key: format!("layer {i}"),
                reason: "a recurrent layer where the recipe expects attention".into(),
            }),
        }
    }

    /// The dense MLP of a layer (every layer of the dense families).
    pub fn mlp(&self, i: usize) -> Result<&MlpWeights, ModelError> {
        match &self.ffn {
            Ffn::Dense(m) => Ok(m),
            Ffn::Moe(_) => Err(ModelError::BadParam {
                key: format!("layer {i}"),
                reason: "a mixture of experts where the recipe expects a dense MLP".into(),
            }),
        }
    }

    /// Every matrix of the layer (for repacking).
    pub fn matrices_mut(&mut self) -> Vec<&mut Weight> {
        let mut v: Vec<&mut Weight> = match &mut self.mixer {
            Mixer::Attention(a) => vec![&mut a.wq, &mut a.wk, &mut a.wv, &mut a.wo],
            Mixer::DeltaNet(d) => d.matrices_mut().into_iter().collect(),
        };
        v.extend(self.ffn.matrices_mut());
        v
    }

    pub fn matrices(&self) -> Vec<&Weight> {
        let mut v: Vec<&Weight> = match &self.mixer {
            Mixer::Attention(a) => vec![&a.wq, &a.wk, &a.wv, &a.wo],
            Mixer::DeltaNet(d) => d.matrices().into_iter().collect(),
        };
        v.extend(self.ffn.matrices());
        v
    }

    /// Weight bytes one decoded token reads in this layer (a mixture counts the experts a
    /// token is routed to, not all of them).
    pub fn bytes_per_token(&self) -> u64 {
        let mixer: Vec<&Weight> = match &self.mixer {
            Mixer::Attention(a) => vec![&a.wq, &a.wk, &a.wv, &a.wo],
            Mixer::DeltaNet(d) => d.matrices().into_iter().collect(),
        };
        mixer.iter().map(|w| w.bytes().len() as u64).sum::<u64>() + self.ffn.bytes_per_token()
    }
}

/// Which optional parts a family's attention block has.
pub struct AttnParts {
    pub qkv_bias: bool,
    pub qk_norm: bool,
}

/// A dense family's layer: attention with `parts`, then the SwiGLU MLP.
pub fn load_layer(
    store: &TensorStore,
    cfg: &ModelConfig,
    i: usize,
    parts: AttnParts,
) -> Result<LayerWeights, ModelError> {
    let mixer = load_attention(store, cfg, i, parts)?;
    let norm = store.vector(&format!("blk.{i}.ffn_norm.weight"), cfg.dim)?;
    Ok(LayerWeights {
        mixer,
        ffn: Ffn::Dense(load_mlp(store, cfg, i, norm)?),
    })
}

/// The attention block of layer `i` (llama, qwen2, qwen3 and Qwen3-MoE).
pub fn load_attention(
    store: &TensorStore,
    cfg: &ModelConfig,
    i: usize,
    parts: AttnParts,
) -> Result<Mixer, ModelError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let (dim, q_dim, kv_dim) = (cfg.dim, cfg.q_dim(), cfg.kv_dim());
    let bias = if parts.qkv_bias {
        Some(QkvBias {
            q: store.vector(&n("attn_q.bias"), q_dim)?,
            k: store.vector(&n("attn_k.bias"), kv_dim)?,
            v: store.vector(&n("attn_v.bias"), kv_dim)?,
        })
    } else {
        None
    };
    let qk_norm = if parts.qk_norm {
        Some(QkNorm {
            q: store.vector(&n("attn_q_norm.weight"), cfg.head_dim)?,
            k: store.vector(&n("attn_k_norm.weight"), cfg.head_dim)?,
        })
    } else {
        None
    };
    Ok(Mixer::Attention(AttnWeights {
        norm: store.vector(&n("attn_norm.weight"), dim)?,
        wq: store.matrix(&n("attn_q.weight"), q_dim, dim)?,
        wk: store.matrix(&n("attn_k.weight"), kv_dim, dim)?,
        wv: store.matrix(&n("attn_v.weight"), kv_dim, dim)?,
        wo: store.matrix(&n("attn_output.weight"), dim, q_dim)?,
        bias,
        qk_norm,
    }))
}

/// The MLP of layer `i`, with its input norm `norm` already loaded.
pub fn load_mlp(
    store: &TensorStore,
    cfg: &ModelConfig,
    i: usize,
    norm: Vec<f32>,
) -> Result<MlpWeights, ModelError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    Ok(MlpWeights {
        norm,
        gate: store.matrix(&n("ffn_gate.weight"), cfg.ffn_dim, cfg.dim)?,
        up: store.matrix(&n("ffn_up.weight"), cfg.ffn_dim, cfg.dim)?,
        down: store.matrix(&n("ffn_down.weight"), cfg.dim, cfg.ffn_dim)?,
    })
}

/// Q, K, V of a batch: `[T, q_dim]`, `[T, kv_dim]`, `[T, kv_dim]`.
pub struct Qkv {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// The attention block's input norm and projections.
pub fn project_qkv(ctx: &Ctx, a: &AttnWeights, layer: usize, x: &[f32]) -> Result<Qkv, ModelError> {
    let mut h = vec![0f32; x.len()];
    ops::rms_norm_into(x, &a.norm, ctx.cfg.rms_eps, &mut h);
    tap("attn_norm", layer, &h);
    let [q, k, v] = ctx.matmul_fused([&a.wq, &a.wk, &a.wv], &h)?;
    let qkv = Qkv { q, k, v };
    tap("Qcur", layer, &qkv.q);
    tap("Kcur", layer, &qkv.k);
    tap("Vcur", layer, &qkv.v);
    Ok(qkv)
}

pub fn add_qkv_bias(qkv: &mut Qkv, b: &QkvBias) {
    ops::add_bias(&mut qkv.q, &b.q);
    ops::add_bias(&mut qkv.k, &b.k);
    ops::add_bias(&mut qkv.v, &b.v);
}

pub fn qk_head_norm(ctx: &Ctx, qkv: &mut Qkv, n: &QkNorm) {
    ops::rms_norm(&mut qkv.q, &n.q, ctx.cfg.rms_eps);
    ops::rms_norm(&mut qkv.k, &n.k, ctx.cfg.rms_eps);
}

/// RoPE, cache write, attention over the cache, output projection; adds the result to `x`.
pub fn attend(
    ctx: &Ctx,
    a: &AttnWeights,
    layer: usize,
    qkv: Qkv,
    kv: &mut KvPool,
    x: &mut [f32],
) -> Result<(), ModelError> {
    let att = attention_core(ctx, layer, layer, qkv, kv);
    project_out(ctx, a, layer, &att, x)
}

/// RoPE, cache write (as KV layer `kv_layer`) and attention over the cache: `[T, q_dim]`.
pub fn attention_core(
    ctx: &Ctx,
    layer: usize,
    kv_layer: usize,
    mut qkv: Qkv,
    kv: &mut KvPool,
) -> Vec<f32> {
    let cfg = ctx.cfg;
    ctx.rope.apply(&mut qkv.q, cfg.head_dim);
    ctx.rope.apply(&mut qkv.k, cfg.head_dim);
    tap("Qcur_rope", layer, &qkv.q);
    tap("Kcur_rope", layer, &qkv.k);
    let kv_dim = cfg.kv_dim();
    for (t, &row) in ctx.rows.iter().enumerate() {
        let span = t * kv_dim..(t + 1) * kv_dim;
        kv.write_row(kv_layer, row, &qkv.k[span.clone()], &qkv.v[span]);
    }
    let mut att = vec![0f32; qkv.q.len()];
    causal_attention(
        ctx.pool,
        kv,
        kv_layer,
        &qkv.q,
        ctx.tokens,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        &mut att,
    );
    tap("kqv_out", layer, &att);
    att
}

/// The output projection of the attention block; adds the result to `x`.
pub fn project_out(
    ctx: &Ctx,
    a: &AttnWeights,
    layer: usize,
    att: &[f32],
    x: &mut [f32],
) -> Result<(), ModelError> {
    let o = ctx.matmul(&a.wo, att)?;
    tap("attn_out", layer, &o);
    ops::add_in_place(x, &o);
    tap("ffn_inp", layer, x);
    Ok(())
}

/// `x += down(silu(gate(norm(x))) * up(norm(x)))`
pub fn mlp(ctx: &Ctx, m: &MlpWeights, layer: usize, x: &mut [f32]) -> Result<(), ModelError> {
    let mut h = vec![0f32; x.len()];
    ops::rms_norm_into(x, &m.norm, ctx.cfg.rms_eps, &mut h);
    tap("ffn_norm", layer, &h);
    let [mut gate, up] = ctx.matmul_fused([&m.gate, &m.up], &h)?;
    tap("ffn_gate", layer, &gate);
    tap("ffn_up", layer, &up);
    ops::swiglu(ctx.pool, &mut gate, &up, m.gate.rows);
    tap("ffn_swiglu", layer, &gate);
    let down = ctx.matmul(&m.down, &gate)?;
    tap("ffn_out", layer, &down);
    ops::add_in_place(x, &down);
    tap("l_out", layer, x);
    Ok(())
}
