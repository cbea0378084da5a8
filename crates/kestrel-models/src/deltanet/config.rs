//! Shapes of the gated-DeltaNet layers of a hybrid model (Qwen3.5), read from GGUF metadata
//! (`{arch}.ssm.*`, `attention.recurrent_layers`, `full_attention_interval`) or from a Hugging
//! Face config.json (`linear_*`, `layer_types`).

use crate::ModelError;
use kestrel_gguf::{Header, Value};

/// How value heads share key heads when there are fewer key heads than value heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadGrouping {
    /// Value head `h` reads key head `h / (n_v / n_k)` (Hugging Face's `repeat_interleave`).
    Grouped,
    /// Value head `h` reads key head `h % n_k`: llama.cpp's converter reorders the value heads
    /// (of `attn_qkv`, `attn_gate`, `ssm_alpha`, `ssm_beta`, `ssm_a`, `ssm_dt`, `ssm_conv1d`,
    /// `ssm_out`) so that ggml's tiling broadcast pairs them up.
    Tiled,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeltaNetConfig {
    /// Per layer: true for a gated-DeltaNet layer, false for full attention.
    pub recurrent: Vec<bool>,
    /// Taps of the causal depthwise convolution (4).
    pub conv_kernel: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    /// Key (and query) head size: the rows of each head's state matrix.
    pub head_k_dim: usize,
    /// Value head size: the columns of each head's state matrix.
    pub head_v_dim: usize,
    pub grouping: HeadGrouping,
}

impl DeltaNetConfig {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_k_dim
    }

    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_v_dim
    }

    /// Channels of the convolution: q, k and v side by side.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Floats of the convolution window kept between steps: the last `conv_kernel - 1` inputs.
    pub fn conv_floats(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels()
    }

    /// Floats of the recurrent state matrices: `n_v_heads x head_k_dim x head_v_dim`.
    pub fn ssm_floats(&self) -> usize {
        self.n_v_heads * self.head_k_dim * self.head_v_dim
    }

    pub fn n_recurrent(&self) -> usize {
        self.recurrent.iter().filter(|&&r| r).count()
    }

    /// Bytes of one sequence's recurrent state (f32, every DeltaNet layer).
    pub fn state_bytes(&self) -> usize {
        4 * self.n_recurrent() * (self.conv_floats() + self.ssm_floats())
    }

    /// The key head value head `v` reads.
    #[inline]
    pub fn k_head_of(&self, v: usize) -> usize {
        match self.grouping {
            HeadGrouping::Grouped => v / (self.n_v_heads / self.n_k_heads),
            HeadGrouping::Tiled => v % self.n_k_heads,
        }
    }

    /// From GGUF metadata of architecture `arch` (`qwen35`).
    pub fn from_gguf(h: &Header, arch: &str, n_layers: usize) -> Result<Self, ModelError> {
        let key = |k: &str| format!("{arch}.{k}");
        let uint = |k: &str| -> Result<usize, ModelError> {
            let full = key(k);
            h.get(&full)
                .ok_or_else(|| ModelError::MissingParam(full.clone()))?
                .as_u64()
                .map(|v| v as usize)
                .ok_or(ModelError::BadParam {
                    key: full,
                    reason: "not an unsigned integer".into(),
                })
        };
        let recurrent = match h
            .get(&key("attention.recurrent_layers"))
            .and_then(Value::as_array)
        {
            Some(flags) => flags
                .iter()
                .map(|v| {
                    v.as_bool().ok_or(ModelError::BadParam {
                        key: key("attention.recurrent_layers"),
                        reason: "not an array of booleans".into(),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => by_interval(n_layers, uint("full_attention_interval")?),
        };
        let n_v_heads = uint("ssm.time_step_rank")?;
        let inner = uint("ssm.inner_size")?;
        let cfg = Self {
            recurrent,
            conv_kernel: uint("ssm.conv_kernel")?,
            n_k_heads: uint("ssm.group_count")?,
            n_v_heads,
            head_k_dim: uint("ssm.state_size")?,
            head_v_dim: inner.checked_div(n_v_heads).unwrap_or(0),
            grouping: HeadGrouping::Tiled,
        };
        cfg.validate(n_layers)?;
        Ok(cfg)
    }

    /// From a Hugging Face config.json (`qwen3_5_text`).
    pub fn from_hf_json(json: &serde_json::Value, n_layers: usize) -> Result<Self, ModelError> {
        let uint = |k: &str| -> Result<usize, ModelError> {
            json[k]
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::MissingParam(k.to_string()))
        };
        let recurrent = match json["layer_types"].as_array() {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("linear_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(ModelError::BadParam {
                        key: "layer_types".into(),
                        reason: format!("unknown layer type {t}"),
                    }),
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => by_interval(
                n_layers,
                json["full_attention_interval"].as_u64().unwrap_or(4) as usize,
            ),
        };
        let cfg = Self {
            recurrent,
            conv_kernel: uint("linear_conv_kernel_dim")?,
            n_k_heads: uint("linear_num_key_heads")?,
            n_v_heads: uint("linear_num_value_heads")?,
            head_k_dim: uint("linear_key_head_dim")?,
            head_v_dim: uint("linear_value_head_dim")?,
            grouping: HeadGrouping::Grouped,
        };
        cfg.validate(n_layers)?;
        Ok(cfg)
    }

    fn validate(&self, n_layers: usize) -> Result<(), ModelError> {
        let bad = |key: &str, reason: String| {
            Err(ModelError::BadParam {
                key: key.into(),
                reason,
            })
        };
        if self.recurrent.len() != n_layers {
            return bad(
                "recurrent_layers",
                format!("{} flags for {n_layers} layers", self.recurrent.len()),
            );
        }
        if self.n_k_heads == 0 || !self.n_v_heads.is_multiple_of(self.n_k_heads) {
            return bad(
                "ssm.group_count",
                format!(
                    "{} value heads cannot be grouped over {} key heads",
                    self.n_v_heads, self.n_k_heads
                ),
            );
        }
        for (k, v) in [
            ("ssm.conv_kernel", self.conv_kernel),
            ("ssm.state_size", self.head_k_dim),
            ("ssm.head_v_dim", self.head_v_dim),
        ] {
            if v == 0 || v > 4096 {
                return bad(k, format!("value {v} out of range"));
            }
        }
        Ok(())
    }
}

/// Every `interval`-th layer is full attention, the others recurrent.
fn by_interval(n_layers: usize, interval: usize) -> Vec<bool> {
    (0..n_layers)
        .map(|i| interval == 0 || (i + 1) % interval != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_four_makes_every_fourth_layer_attention() {
        let r = by_interval(8, 4);
        assert_eq!(r, [true, true, true, false, true, true, true, false]);
    }

    #[test]
    fn grouped_and_tiled_pair_value_heads_differently() {
        let mut c = DeltaNetConfig {
            recurrent: vec![true],
            conv_kernel: 4,
            n_k_heads: 2,
            n_v_heads: 4,
            head_k_dim: 16,
            head_v_dim: 16,
            grouping: HeadGrouping::Grouped,
        };
        assert_eq!(
            (0..4).map(|v| c.k_head_of(v)).collect::<Vec<_>>(),
            [0, 0, 1, 1]
        );
        c.grouping = HeadGrouping::Tiled;
        assert_eq!(
            (0..4).map(|v| c.k_head_of(v)).collect::<Vec<_>>(),
            [0, 1, 0, 1]
        );
        // conv window 3 x 128, states 4 x 16 x 16, f32
        assert_eq!(c.state_bytes(), 4 * (3 * 128 + 4 * 16 * 16));
    }
}
