//! Qwen3.5: a hybrid of gated-DeltaNet layers (three of every four) and gated full attention,
//! each followed by the SwiGLU MLP.
//!
//! What differs from Qwen3 in the attention layers: the q projection yields, per head, the
//! query and then an output gate of the same size (`[n_heads, 2, head_dim]`); the attention
//! output is multiplied by `sigmoid(gate)` before the output projection; RoPE turns only the
//! first `rope_dim` dimensions of each head (a quarter), NeoX-style. The multimodal RoPE
//! sections reduce to plain RoPE for text, where all three position streams are equal.
//!
//! Every RMSNorm but the DeltaNet's gated one scales by `1 + w` in Hugging Face's checkpoints;
//! llama.cpp's converter stores `1 + w` in the GGUF, so [`norm`] adds the one for HF folders.

use crate::config::ModelConfig;
use crate::deltanet::{layer as deltanet, DeltaNetWeights, StatePool};
use crate::kv::KvPool;
use crate::layers::{self, AttnWeights, Ctx, LayerWeights, Mixer, QkNorm, Qkv};
use crate::tap::tap;
use crate::weights::{StoreFormat, TensorStore};
use crate::ModelError;

/// An RMSNorm weight as the forward pass multiplies by it (`1 + w` for HF folders).
pub fn norm(store: &TensorStore, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let mut w = store.vector(name, len)?;
    if store.format == StoreFormat::HuggingFace {
        for v in w.iter_mut() {
            *v += 1.0;
        }
    }
    Ok(w)
}

fn hybrid(cfg: &ModelConfig) -> Result<&crate::deltanet::DeltaNetConfig, ModelError> {
    cfg.hybrid
        .as_ref()
        .ok_or_else(|| ModelError::MissingParam("qwen35.ssm.* (recurrent layer shapes)".into()))
}

pub fn load_layer(
    store: &TensorStore,
    cfg: &ModelConfig,
    i: usize,
) -> Result<LayerWeights, ModelError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let dim = cfg.dim;
    let attn_norm = norm(store, &n("attn_norm.weight"), dim)?;
    let mixer = if cfg.is_recurrent(i) {
        Mixer::DeltaNet(DeltaNetWeights::load(
            store,
            hybrid(cfg)?,
            dim,
            i,
            attn_norm,
        )?)
    } else {
        let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
        Mixer::Attention(AttnWeights {
            norm: attn_norm,
            // (n_heads * 2 * head_dim, dim): per head, the query rows then the gate rows
            wq: store.matrix(&n("attn_q.weight"), 2 * q_dim, dim)?,
            wk: store.matrix(&n("attn_k.weight"), kv_dim, dim)?,
            wv: store.matrix(&n("attn_v.weight"), kv_dim, dim)?,
            wo: store.matrix(&n("attn_output.weight"), dim, q_dim)?,
            bias: None,
            qk_norm: Some(QkNorm {
                q: norm(store, &n("attn_q_norm.weight"), cfg.head_dim)?,
                k: norm(store, &n("attn_k_norm.weight"), cfg.head_dim)?,
            }),
        })
    };
    // GGUF names the MLP's input norm post_attention_norm; HF's maps to ffn_norm.
    let mlp_norm_name = if store.contains(&n("post_attention_norm.weight")) {
        n("post_attention_norm.weight")
    } else {
        n("ffn_norm.weight")
    };
    let mlp_norm = norm(store, &mlp_norm_name, dim)?;
    Ok(LayerWeights {
        mixer,
        ffn: layers::Ffn::Dense(layers::load_mlp(store, cfg, i, mlp_norm)?),
    })
}

pub fn forward_layer(
    ctx: &Ctx,
    l: &LayerWeights,
    i: usize,
    kv: &mut KvPool,
    states: &mut StatePool,
    x: &mut [f32],
) -> Result<(), ModelError> {
    let cfg = ctx.cfg;
    match &l.mixer {
        Mixer::DeltaNet(d) => {
            let h = hybrid(cfg)?;
            let r = (0..i).filter(|&j| cfg.is_recurrent(j)).count();
            deltanet::forward(ctx, d, h, i, r, states, x)?;
        }
        Mixer::Attention(a) => gated_attention(ctx, a, i, kv, x)?,
    }
    layers::ffn(ctx, &l.ffn, i, x)
}

/// Attention with q/k norms, partial RoPE and a sigmoid gate on its output.
fn gated_attention(
    ctx: &Ctx,
    a: &AttnWeights,
    i: usize,
    kv: &mut KvPool,
    x: &mut [f32],
) -> Result<(), ModelError> {
    let cfg = ctx.cfg;
    let (hd, q_dim) = (cfg.head_dim, cfg.q_dim());
    let qkv = layers::project_qkv(ctx, a, i, x)?;
    // split [T, n_heads, (query | gate)] into q [T, q_dim] and gate [T, q_dim]
    let mut q = vec![0f32; ctx.t_len * q_dim];
    let mut gate = vec![0f32; ctx.t_len * q_dim];
    for (t, row) in qkv.q.chunks_exact(2 * q_dim).enumerate() {
        for (h, head) in row.chunks_exact(2 * hd).enumerate() {
            let at = t * q_dim + h * hd;
            q[at..at + hd].copy_from_slice(&head[..hd]);
            gate[at..at + hd].copy_from_slice(&head[hd..]);
        }
    }
    let mut qkv = Qkv {
        q,
        k: qkv.k,
        v: qkv.v,
    };
    if let Some(n) = &a.qk_norm {
        layers::qk_head_norm(ctx, &mut qkv, n);
    }
    let mut att = layers::attention_core(ctx, i, cfg.kv_layer(i), qkv, kv);
    for (o, &g) in att.iter_mut().zip(&gate) {
        *o *= 1.0 / (1.0 + (-g).exp());
    }
    tap("attn_gated", i, &att);
    layers::project_out(ctx, a, i, &att, x)
}

/// The final norm's weight (`1 + w` for HF folders).
pub fn output_norm(store: &TensorStore, cfg: &ModelConfig) -> Result<Vec<f32>, ModelError> {
    norm(store, "output_norm.weight", cfg.dim)
}
