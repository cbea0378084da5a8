//! Which type each tensor gets: llama.cpp's choices (`llama_tensor_get_type` in
//! llama-quant.cpp, no importance matrix), so a file quantized here has the same type for every
//! tensor as one made by llama.cpp's quantizer from the same source.

use kestrel_gguf::GgmlType;

/// What the user asks for (`--type`): one type for everything, or a `_m` mixture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMix {
    Q8_0,
    Q4_0,
    Q4KM,
    Q5KM,
    Q6K,
}

impl QuantMix {
    pub const NAMES: &'static str = "q8_0, q4_0, q4_k_m, q5_k_m, q6_k";

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "q8_0" => Self::Q8_0,
            "q4_0" => Self::Q4_0,
            "q4_k_m" | "q4_k" => Self::Q4KM,
            "q5_k_m" | "q5_k" => Self::Q5KM,
            "q6_k" => Self::Q6K,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4KM => "q4_k_m",
            Self::Q5KM => "q5_k_m",
            Self::Q6K => "q6_k",
        }
    }

    /// llama.cpp's `llama_ftype` (GGUF `general.file_type`).
    pub fn file_type(self) -> u32 {
        match self {
            Self::Q4_0 => 2,
            Self::Q8_0 => 7,
            Self::Q4KM => 15,
            Self::Q5KM => 17,
            Self::Q6K => 18,
        }
    }

    /// The type of every tensor the mixture does not single out.
    pub fn default_type(self) -> GgmlType {
        match self {
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q4_0 => GgmlType::Q4_0,
            Self::Q4KM => GgmlType::Q4_K,
            Self::Q5KM => GgmlType::Q5_K,
            Self::Q6K => GgmlType::Q6_K,
        }
    }
}

/// What the rules need to know about the whole model.
#[derive(Debug, Clone)]
pub struct ModelFacts {
    pub n_layers: usize,
    /// Experts per layer (0 or 1 for dense models).
    pub n_experts: usize,
    /// How many attention-v-like tensors (`attn_v`, `attn_qkv`) the model has.
    pub n_attn_v: usize,
    /// Whether the token embedding is also the output (no `output.weight`).
    pub tied: bool,
}

/// Whether llama.cpp quantizes a tensor at all: 2-D and 3-D weights, but not norms, the MoE
/// router, or the small conv weights of recurrent layers.
pub fn quantizable(name: &str, n_dims: usize) -> bool {
    n_dims >= 2
        && name.ends_with("weight")
        && !name.contains("_norm.weight")
        && !name.contains("ffn_gate_inp.weight")
        && !name.contains("ssm_conv1d")
}

fn is_attn_v(name: &str) -> bool {
    name.contains("attn_v.weight") || name.contains("attn_qkv.weight")
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third
/// between them.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// The type of tensor `name` (ggml dims `dims`, now `current`): `attn_v_index` counts the
/// attention-v-like tensors before this one in file order.
pub fn target_type(
    mix: QuantMix,
    name: &str,
    dims: &[u64],
    current: GgmlType,
    facts: &ModelFacts,
    attn_v_index: usize,
) -> GgmlType {
    if !quantizable(name, dims.len()) {
        return current;
    }
    use GgmlType::*;
    let d = mix.default_type();
    let cols = dims.first().copied().unwrap_or(0);
    let experts8 = facts.n_experts == 8;
    let mut ty = d;
    if name == "output.weight" || (facts.tied && name == "token_embd.weight") {
        ty = if cols % d.block_len() != 0 {
            Q8_0
        } else if d != Q8_0 {
            Q6_K
        } else {
            d
        };
    } else if name == "token_embd.weight" {
        // the default type
    } else if is_attn_v(name) {
        if matches!(mix, QuantMix::Q4KM | QuantMix::Q5KM)
            && use_more_bits(attn_v_index, facts.n_attn_v)
        {
            ty = Q6_K;
        }
        if experts8 {
            ty = Q8_0;
        }
    } else if name.contains("attn_k.weight") {
        if experts8 {
            ty = Q8_0;
        }
    } else if name.contains("ffn_down") {
        let layer = layer_of(name).unwrap_or(0);
        if matches!(mix, QuantMix::Q4KM | QuantMix::Q5KM) && use_more_bits(layer, facts.n_layers) {
            ty = Q6_K;
        }
    } else if name.contains("attn_output.weight") && experts8 && mix == QuantMix::Q4KM {
        ty = Q5_K;
    }
    fallback(ty, cols)
}

/// llama.cpp's `tensor_type_fallback`: a type whose blocks do not divide the row length gives
/// way to a 32-element one, and to F16 when even that does not fit.
fn fallback(ty: GgmlType, cols: u64) -> GgmlType {
    use GgmlType::*;
    if cols.is_multiple_of(ty.block_len()) {
        return ty;
    }
    let next = match ty {
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        Q2_K | Q3_K => Q4_0,
        other => other,
    };
    if cols.is_multiple_of(next.block_len()) {
        next
    } else {
        F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlType::*;

    fn facts(n_experts: usize) -> ModelFacts {
        ModelFacts {
            n_layers: 24,
            n_experts,
            n_attn_v: 24,
            tied: true,
        }
    }

    #[test]
    fn q4_k_m_follows_llama_cpp() {
        let f = facts(0);
        let t = |name: &str, i| target_type(QuantMix::Q4KM, name, &[896, 128], F16, &f, i);
        // 896 columns: not a multiple of 256, so K-quants fall back
        assert_eq!(t("blk.0.attn_q.weight", 0), Q5_0);
        assert_eq!(t("blk.0.attn_v.weight", 0), Q8_0); // Q6_K -> Q8_0
        let t = |name: &str, i| target_type(QuantMix::Q4KM, name, &[1536, 128], F16, &f, i);
        assert_eq!(t("blk.0.attn_v.weight", 0), Q6_K);
        assert_eq!(t("blk.3.attn_v.weight", 3), Q4_K);
        assert_eq!(t("blk.5.attn_v.weight", 5), Q6_K); // (5 - 3) % 3 == 2
        assert_eq!(t("blk.23.ffn_down.weight", 0), Q6_K);
        assert_eq!(t("blk.4.ffn_down.weight", 0), Q4_K);
        assert_eq!(t("blk.4.ffn_up.weight", 0), Q4_K);
        assert_eq!(t("token_embd.weight", 0), Q6_K); // tied: the output's type
        assert_eq!(t("blk.4.attn_norm.weight", 0), F16); // norms are never quantized
        assert_eq!(
            target_type(QuantMix::Q4KM, "blk.0.ffn_norm.weight", &[1536], F32, &f, 0),
            F32
        );
    }

    #[test]
    fn eight_experts_bump_attention() {
        let f = facts(8);
        let t = |name: &str| target_type(QuantMix::Q4KM, name, &[2048, 512], F16, &f, 7);
        assert_eq!(t("blk.1.attn_v.weight"), Q8_0);
        assert_eq!(t("blk.1.attn_k.weight"), Q8_0);
        assert_eq!(t("blk.1.attn_output.weight"), Q5_K);
        assert_eq!(t("blk.1.ffn_gate_inp.weight"), F16);
        let f = facts(128);
        let t = |name: &str| target_type(QuantMix::Q4KM, name, &[2048, 768, 128], F16, &f, 7);
        assert_eq!(t("blk.1.ffn_gate_exps.weight"), Q4_K);
        assert_eq!(t("blk.0.ffn_down_exps.weight"), Q6_K);
    }

    #[test]
    fn single_types_keep_the_output_at_q6_k_or_q8_0() {
        let f = facts(0);
        let t = |mix, name: &str| target_type(mix, name, &[512, 64], F32, &f, 0);
        assert_eq!(t(QuantMix::Q8_0, "token_embd.weight"), Q8_0);
        assert_eq!(t(QuantMix::Q4_0, "token_embd.weight"), Q6_K);
        assert_eq!(t(QuantMix::Q4_0, "blk.0.attn_v.weight"), Q4_0);
        assert_eq!(t(QuantMix::Q6K, "blk.0.attn_v.weight"), Q6_K);
        assert_eq!(
            target_type(QuantMix::Q6K, "blk.0.attn_q.weight", &[64, 64], F32, &f, 0),
            Q8_0
        );
    }
}
