//! The memory plan: weights + KV + scratch, computed from the config before anything is loaded.

use crate::config::ModelConfig;
use crate::model::DEFAULT_MAX_BATCH;

/// Bytes per K/V element for q8_0 (34-byte blocks of 32).
pub const Q8_0_KV_BYTES: f64 = 34.0 / 32.0;
pub const F16_KV_BYTES: f64 = 2.0;

#[derive(Debug, Clone, PartialEq)]
pub struct PlanRow {
    pub context: usize,
    pub kv_f16: u64,
    pub kv_q8_0: u64,
    pub total_f16: u64,
    pub total_q8_0: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// Sum of every tensor's size from its type and shape.
    pub weight_bytes: u64,
    pub kv_bytes_per_token_f16: f64,
    pub kv_bytes_per_token_q8_0: f64,
    /// Activation scratch of one forward step of `max_batch` tokens, plus the logits.
    pub scratch_bytes: u64,
    /// Recurrent state of one sequence (hybrid models; 0 otherwise), counted once in the totals.
    pub state_bytes_per_sequence: u64,
    pub rows: Vec<PlanRow>,
    /// MemAvailable of the machine, when known.
    pub available_bytes: Option<u64>,
}

impl MemoryPlan {
    /// Plan at 4k, 16k, 32k and the model's own maximum context (those not above it).
    pub fn new(cfg: &ModelConfig, weight_bytes: u64) -> Self {
        let mut contexts: Vec<usize> = [4096, 16384, 32768]
            .into_iter()
            .filter(|&c| c < cfg.max_context)
            .collect();
        contexts.push(cfg.max_context);
        Self::for_contexts(cfg, weight_bytes, &contexts)
    }

    pub fn for_contexts(cfg: &ModelConfig, weight_bytes: u64, contexts: &[usize]) -> Self {
        let kv_f16 = cfg.kv_bytes_per_token(F16_KV_BYTES);
        let kv_q8 = cfg.kv_bytes_per_token(Q8_0_KV_BYTES);
        let scratch = scratch_bytes(cfg, DEFAULT_MAX_BATCH);
        let state = cfg.state_bytes() as u64;
        let rows = contexts
            .iter()
            .map(|&context| {
                let f16 = (kv_f16 * context as f64) as u64;
                let q8 = (kv_q8 * context as f64) as u64;
                PlanRow {
                    context,
                    kv_f16: f16,
                    kv_q8_0: q8,
                    total_f16: weight_bytes + f16 + scratch + state,
                    total_q8_0: weight_bytes + q8 + scratch + state,
                }
            })
            .collect();
        Self {
            weight_bytes,
            kv_bytes_per_token_f16: kv_f16,
            kv_bytes_per_token_q8_0: kv_q8,
            scratch_bytes: scratch,
            state_bytes_per_sequence: state,
            rows,
            available_bytes: available_memory(),
        }
    }

    /// Whether `bytes` fits in the machine's available memory (None when unknown).
    pub fn fits(&self, bytes: u64) -> Option<bool> {
        self.available_bytes.map(|a| bytes <= a)
    }
}

/// Weight bytes one decoded token reads, from every tensor's (GGUF) name and size: all of
/// them but the token embedding (one row, unless it is also the output) — and of a mixture's
/// experts (`*_exps*`), only the `n_used / n_experts` share a token is routed to.
pub fn read_bytes_per_token<'a>(
    cfg: &ModelConfig,
    tensors: impl Iterator<Item = (&'a str, u64)> + Clone,
) -> u64 {
    let tied = !tensors.clone().any(|(name, _)| name == "output.weight");
    tensors
        .map(|(name, bytes)| match (name, &cfg.moe) {
            ("token_embd.weight", _) if !tied => bytes / cfg.vocab_size.max(1) as u64,
            (n, Some(m)) if n.contains("_exps") => bytes * m.n_used as u64 / m.n_experts as u64,
            _ => bytes,
        })
        .sum()
}

/// Upper bound of the f32 activations one forward step of `batch` tokens holds at once.
pub fn scratch_bytes(cfg: &ModelConfig, batch: usize) -> u64 {
    // residual + normed copy + q + k + v + attention out + projection out + gate + up
    let mut per_token = 3 * cfg.dim + 2 * cfg.q_dim() + 2 * cfg.kv_dim() + 2 * cfg.ffn_dim;
    if let Some(m) = &cfg.moe {
        // each token's rows gathered for each of its experts: input, gate, up, output
        per_token += m.n_used * (2 * cfg.dim + 2 * m.expert_ffn_dim) + m.n_experts;
    }
    if let Some(h) = &cfg.hybrid {
        // gated attention: the doubled q projection and the gate; DeltaNet: projections and
        // convolution output, z and the rule's output, and each task's f64 copy of its head
        per_token += 2 * cfg.q_dim() + 2 * h.conv_channels() + 2 * h.value_dim();
        per_token += 2 * (2 * h.head_k_dim + 2 * h.head_v_dim + 2) * 2;
    }
    // + quantized copies of the widest activation (Q8_K rows, ~1.14 bytes per element, and
    // where AMX runs the same quants as A tiles, 1 byte), + the last token's logits
    let floats = batch * per_token + batch * cfg.ffn_dim.max(cfg.dim) * 3 / 4 + cfg.vocab_size;
    (floats * 4) as u64
}

/// MemAvailable from /proc/meminfo (Linux); None elsewhere.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}
