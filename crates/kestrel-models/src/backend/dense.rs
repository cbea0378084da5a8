//! The dense decoder recipe (llama, qwen2, qwen3), written once over [`Ops`]: what makes a
//! family differ is two visible lines (q/k/v biases for Qwen2, q/k norms for Qwen3).

use super::{Buf, Ops, Param, W};
use crate::config::{Arch, ModelConfig};

/// Which optional parts a dense family's attention block has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    pub qkv_bias: bool,
    pub qk_norm: bool,
}

impl Family {
    /// Qwen3's attention block (per-head q/k norms, no biases): Qwen3 and Qwen3-MoE.
    pub const QWEN3: Self = Self {
        qkv_bias: false,
        qk_norm: true,
    };

    /// The dense families; `None` for architectures this recipe does not cover (Qwen3-MoE's
    /// routed FFN: [`super::moe`]; Qwen3.5: [`super::hybrid`]).
    pub fn of(arch: Arch) -> Option<Self> {
        match arch {
            Arch::Llama => Some(Self {
                qkv_bias: false,
                qk_norm: false,
            }),
            Arch::Qwen2 => Some(Self {
                qkv_bias: true,
                qk_norm: false,
            }),
            Arch::Qwen3 => Some(Self::QWEN3),
            Arch::Qwen3Moe | Arch::Qwen35 => None,
        }
    }
}

/// One forward pass: embeddings, every layer, then the logits of the picked rows.
pub fn forward<O: Ops + ?Sized>(o: &mut O, cfg: &ModelConfig, f: Family) -> Result<(), O::Error> {
    o.embed(Buf::X)?;
    for l in 0..cfg.n_layers {
        attention(o, f, l)?;
        mlp(o, l)?;
    }
    logits(o)
}

/// The rows whose logits were asked for, through the final norm and the output head (every
/// recipe's last step).
pub fn logits<O: Ops + ?Sized>(o: &mut O) -> Result<(), O::Error> {
    o.pick_rows(Buf::X, Buf::Picked)?;
    o.rms_norm(Buf::Picked, W::OutputNorm, Buf::Picked)?;
    o.matmul(W::Output, Buf::Picked, Buf::Logits)
}

/// A pre-norm attention block added to the residual stream X.
pub fn attention<O: Ops + ?Sized>(o: &mut O, f: Family, l: usize) -> Result<(), O::Error> {
    let w = |p| W::Layer(l, p);
    // attention block: norm, q/k/v projections
    o.rms_norm(Buf::X, w(Param::AttnNorm), Buf::H)?;
    o.matmul(w(Param::Wq), Buf::H, Buf::Q)?;
    o.matmul(w(Param::Wk), Buf::H, Buf::K)?;
    o.matmul(w(Param::Wv), Buf::H, Buf::V)?;
    if f.qkv_bias {
        // what makes it Qwen2
        o.add_bias(Buf::Q, w(Param::BiasQ))?;
        o.add_bias(Buf::K, w(Param::BiasK))?;
        o.add_bias(Buf::V, w(Param::BiasV))?;
    }
    if f.qk_norm {
        // what makes it Qwen3
        o.head_norm(Buf::Q, w(Param::QNorm))?;
        o.head_norm(Buf::K, w(Param::KNorm))?;
    }
    o.rope(Buf::Q)?;
    o.rope(Buf::K)?;
    o.kv_write(l, Buf::K, Buf::V)?;
    o.attention(l, Buf::Q, Buf::Att)?;
    o.matmul_add(w(Param::Wo), Buf::Att, Buf::X)
}

/// The SwiGLU MLP of layer `l`: `x += down(silu(gate(norm(x))) * up(norm(x)))`.
pub fn mlp<O: Ops + ?Sized>(o: &mut O, l: usize) -> Result<(), O::Error> {
    let w = |p| W::Layer(l, p);
    o.rms_norm(Buf::X, w(Param::FfnNorm), Buf::H)?;
    o.gate_up_swiglu(w(Param::Gate), w(Param::Up), Buf::H, Buf::Ffn)?;
    o.matmul_add(w(Param::Down), Buf::Ffn, Buf::X)
}
