//! Hyper-parameters, read from GGUF metadata or a Hugging Face config.json.

use crate::deltanet::DeltaNetConfig;
use crate::ModelError;
use kestrel_gguf::{Header, Value};

/// The model families kestrel has recipes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention with a routed mixture of experts in place of the MLP.
    Qwen3Moe,
    /// Qwen3.5: gated-DeltaNet layers interleaved with gated full attention.
    Qwen35,
}

impl Arch {
    pub fn parse(name: &str) -> Result<Self, ModelError> {
        match name {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            "qwen3moe" | "qwen3_moe" => Ok(Self::Qwen3Moe),
            // GGUF's name, then Hugging Face's model types
            "qwen35" | "qwen3_5_text" | "qwen3_5" => Ok(Self::Qwen35),
            other => Err(ModelError::UnsupportedArch(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3moe",
            Self::Qwen35 => "qwen35",
        }
    }
}

/// How RoPE pairs up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs (x[2i], x[2i+1]): llama in GGUF, whose converter permuted q/k rows.
    Normal,
    /// Halves (x[i], x[i + d/2]): Hugging Face's rotate_half, and Qwen in GGUF.
    NeoX,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    /// Residual stream width.
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Dimensions of each head that RoPE rotates (the rest pass through).
    pub rope_dim: usize,
    pub rope_layout: RopeLayout,
    pub max_context: usize,
    /// The recurrent layers of a hybrid model (Qwen3.5); None for pure attention models.
    pub hybrid: Option<DeltaNetConfig>,
    /// The routed experts of a mixture-of-experts model (Qwen3-MoE); None for dense models.
    pub moe: Option<MoeConfig>,
}

/// A mixture-of-experts FFN: a router picks `n_used` of `n_experts` SwiGLU experts per token.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub n_experts: usize,
    /// Experts each token is routed to (top-k of the router's softmax).
    pub n_used: usize,
    /// Hidden width of one expert.
    pub expert_ffn_dim: usize,
    /// Whether the top-k weights are renormalized to sum to 1 (`norm_topk_prob`).
    pub norm_top_k: bool,
    /// Layers with a dense MLP instead of experts (HF `mlp_only_layers`, `decoder_sparse_step`).
    pub dense_layers: Vec<bool>,
}

impl MoeConfig {
    /// Whether layer `i` routes to experts.
    pub fn is_sparse(&self, i: usize) -> bool {
        !self.dense_layers.get(i).copied().unwrap_or(false)
    }

    fn validate(&self) -> Result<(), ModelError> {
        if self.n_experts == 0 || self.n_used == 0 || self.n_used > self.n_experts {
            return Err(ModelError::BadParam {
                key: "expert_used_count".into(),
                reason: format!(
                    "{} experts used of {}: need 1 <= used <= experts",
                    self.n_used, self.n_experts
                ),
            });
        }
        if self.expert_ffn_dim == 0 || self.expert_ffn_dim > (1 << 24) {
            return Err(ModelError::BadParam {
                key: "expert_feed_forward_length".into(),
                reason: format!("value {} out of range", self.expert_ffn_dim),
            });
        }
        Ok(())
    }
}

impl ModelConfig {
    /// Bytes of K and V per token for `elem_bytes` bytes per element (2.0 for f16, 34/32 for q8_0).
    pub fn kv_bytes_per_token(&self, elem_bytes: f64) -> f64 {
        (2 * self.n_kv_layers() * self.n_kv_heads * self.head_dim) as f64 * elem_bytes
    }

    /// Whether layer `i` is a recurrent (gated-DeltaNet) layer rather than attention.
    pub fn is_recurrent(&self, i: usize) -> bool {
        self.hybrid.as_ref().is_some_and(|h| h.recurrent[i])
    }

    /// Layers that keep K/V (all but the recurrent ones).
    pub fn n_kv_layers(&self) -> usize {
        self.n_layers - self.hybrid.as_ref().map_or(0, |h| h.n_recurrent())
    }

    /// Index of attention layer `i` among the layers that keep K/V.
    pub fn kv_layer(&self, i: usize) -> usize {
        (0..i).filter(|&j| !self.is_recurrent(j)).count()
    }

    /// Bytes of one sequence's recurrent state (0 without recurrent layers).
    pub fn state_bytes(&self) -> usize {
        self.hybrid.as_ref().map_or(0, |h| h.state_bytes())
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Read from GGUF metadata (`{arch}.*` keys).
    pub fn from_gguf(h: &Header) -> Result<Self, ModelError> {
        let arch_name = h
            .architecture()
            .ok_or_else(|| ModelError::MissingParam("general.architecture".into()))?;
        let arch = Arch::parse(arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let uint = |k: &str| -> Result<usize, ModelError> {
            let full = key(k);
            h.get(&full)
                .ok_or_else(|| ModelError::MissingParam(full.clone()))?
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::BadParam {
                    key: full,
                    reason: "not an unsigned integer".into(),
                })
        };
        let opt_uint = |k: &str| h.get(&key(k)).and_then(Value::as_u64).map(|v| v as usize);
        let float = |k: &str| h.get(&key(k)).and_then(Value::as_f64);

        let dim = uint("embedding_length")?;
        let n_heads = uint("attention.head_count")?;
        let n_kv_heads = opt_uint("attention.head_count_kv").unwrap_or(n_heads);
        if n_heads == 0 {
            return Err(ModelError::BadParam {
                key: key("attention.head_count"),
                reason: "zero heads".into(),
            });
        }
        let head_dim = opt_uint("attention.key_length").unwrap_or(dim / n_heads);
        let vocab_size = match opt_uint("vocab_size") {
            Some(v) => v,
            None => h
                .get("tokenizer.ggml.tokens")
                .and_then(Value::as_array)
                .map(|a| a.len())
                .ok_or_else(|| ModelError::MissingParam(key("vocab_size")))?,
        };
        let n_layers = uint("block_count")?;
        let hybrid = match arch {
            Arch::Qwen35 => Some(DeltaNetConfig::from_gguf(h, arch_name, n_layers)?),
            _ => None,
        };
        let moe = match arch {
            // llama.cpp's qwen3moe: every layer routed, top-k weights renormalized
            Arch::Qwen3Moe => Some(MoeConfig {
                n_experts: uint("expert_count")?,
                n_used: uint("expert_used_count")?,
                expert_ffn_dim: uint("expert_feed_forward_length")?,
                norm_top_k: h
                    .get(&key("expert_weights_norm"))
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
                dense_layers: vec![false; n_layers],
            }),
            _ => None,
        };
        let ffn_dim = match &moe {
            Some(m) => opt_uint("feed_forward_length").unwrap_or(m.expert_ffn_dim),
            None => uint("feed_forward_length")?,
        };
        let cfg = Self {
            arch,
            n_layers,
            dim,
            ffn_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            rms_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f32,
            rope_base: float("rope.freq_base").unwrap_or(10_000.0) as f32,
            rope_dim: opt_uint("rope.dimension_count").unwrap_or(head_dim),
            rope_layout: match arch {
                Arch::Llama => RopeLayout::Normal,
                Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen35 => RopeLayout::NeoX,
            },
            max_context: opt_uint("context_length").unwrap_or(4096),
            hybrid,
            moe,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Read from a Hugging Face config.json. HF checkpoints keep q/k unpermuted, so RoPE is NeoX.
    pub fn from_hf_json(json: &serde_json::Value) -> Result<Self, ModelError> {
        // Multimodal Qwen3.5 checkpoints keep the language model's settings in `text_config`.
        let json = match json.get("text_config") {
            Some(text) if text.is_object() => text,
            _ => json,
        };
        let arch = Arch::parse(json["model_type"].as_str().unwrap_or("<missing>"))?;
        let uint = |k: &str| -> Result<usize, ModelError> {
            json[k]
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::MissingParam(k.to_string()))
        };
        let dim = uint("hidden_size")?;
        let n_heads = uint("num_attention_heads")?;
        if n_heads == 0 {
            return Err(ModelError::BadParam {
                key: "num_attention_heads".into(),
                reason: "zero heads".into(),
            });
        }
        let head_dim = json["head_dim"]
            .as_u64()
            .map(|v| v as usize)
            .unwrap_or(dim / n_heads);
        let rope_base = json["rope_parameters"]["rope_theta"]
            .as_f64()
            .or_else(|| json["rope_theta"].as_f64())
            .unwrap_or(10_000.0) as f32;
        let rotary_fraction = json["rope_parameters"]["partial_rotary_factor"]
            .as_f64()
            .or_else(|| json["partial_rotary_factor"].as_f64())
            .unwrap_or(1.0);
        let n_layers = uint("num_hidden_layers")?;
        let hybrid = match arch {
            Arch::Qwen35 => Some(DeltaNetConfig::from_hf_json(json, n_layers)?),
            _ => None,
        };
        let moe = match arch {
            Arch::Qwen3Moe => Some(moe_from_hf_json(json, n_layers)?),
            _ => None,
        };
        let ffn_dim = match &moe {
            Some(m) => json["intermediate_size"]
                .as_u64()
                .map_or(m.expert_ffn_dim, |v| v as usize),
            None => uint("intermediate_size")?,
        };
        let cfg = Self {
            arch,
            n_layers,
            dim,
            ffn_dim,
            n_heads,
            n_kv_heads: json["num_key_value_heads"]
                .as_u64()
                .map(|v| v as usize)
                .unwrap_or(n_heads),
            head_dim,
            vocab_size: uint("vocab_size")?,
            rms_eps: json["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
            rope_base,
            rope_dim: (head_dim as f64 * rotary_fraction) as usize,
            rope_layout: RopeLayout::NeoX,
            max_context: json["max_position_embeddings"].as_u64().unwrap_or(4096) as usize,
            hybrid,
            moe,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ModelError> {
        if let Some(m) = &self.moe {
            m.validate()?;
        }
        let bad = |key: &str, reason: String| {
            Err(ModelError::BadParam {
                key: key.into(),
                reason,
            })
        };
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(
                "head_count_kv",
                format!(
                    "{} heads cannot be grouped over {} kv heads",
                    self.n_heads, self.n_kv_heads
                ),
            );
        }
        if self.head_dim == 0
            || !self.head_dim.is_multiple_of(2)
            || self.rope_dim > self.head_dim
            || !self.rope_dim.is_multiple_of(2)
        {
            return bad(
                "head_dim",
                format!(
                    "head_dim {} / rope_dim {} must be even and rope_dim <= head_dim",
                    self.head_dim, self.rope_dim
                ),
            );
        }
        for (k, v) in [
            ("n_layers", self.n_layers),
            ("dim", self.dim),
            ("ffn_dim", self.ffn_dim),
            ("vocab_size", self.vocab_size),
        ] {
            if v == 0 || v > (1 << 24) {
                return bad(k, format!("value {v} out of range"));
            }
        }
        Ok(())
    }
}

/// Qwen3-MoE's expert settings from a Hugging Face config.json.
fn moe_from_hf_json(json: &serde_json::Value, n_layers: usize) -> Result<MoeConfig, ModelError> {
    let uint = |keys: &[&str]| -> Result<usize, ModelError> {
        keys.iter()
            .find_map(|k| json[*k].as_u64())
            .map(|v| v as usize)
            .ok_or_else(|| ModelError::MissingParam(keys[0].to_string()))
    };
    // A layer is sparse when it is not listed in `mlp_only_layers` and (i + 1) % step == 0.
    let step = json["decoder_sparse_step"].as_u64().unwrap_or(1).max(1) as usize;
    let only: Vec<usize> = json["mlp_only_layers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as usize)
                .collect()
        })
        .unwrap_or_default();
    let dense_layers = (0..n_layers)
        .map(|i| only.contains(&i) || !(i + 1).is_multiple_of(step))
        .collect();
    Ok(MoeConfig {
        n_experts: uint(&["num_experts", "num_local_experts"])?,
        n_used: uint(&["num_experts_per_tok"])?,
        expert_ffn_dim: uint(&["moe_intermediate_size"])?,
        norm_top_k: json["norm_topk_prob"].as_bool().unwrap_or(true),
        dense_layers,
    })
}
