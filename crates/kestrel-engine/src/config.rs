//! Engine configuration.

use crate::error::ConfigError;

/// Scheduling limits, built once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Positions per KV block. Default 16. Must equal the model's `block_size()`.
    pub block_size: usize,
    /// Prefill tokens per sequence per step. Default 512.
    pub chunk_size: usize,
    /// Tokens (decodes + prefill chunks) per step. Default 512. At least `max_running`, so
    /// every running sequence decodes in every step.
    pub step_token_budget: usize,
    /// Sequences admitted (prefilling or decoding) at once (`--parallel`). Default 4.
    pub max_running: usize,
    /// Max prompt + generated tokens of one request. Default 4096.
    pub ctx_size: usize,
    /// Speculative decoding. Default off.
    pub spec: SpecConfig,
}

/// Where speculative tokens come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SpecMode {
    #[default]
    Off,
    /// n-gram lookup in the sequence's own prompt and output.
    Lookup,
    /// A small draft model with the same vocabulary (`Engine::try_start_with_draft`).
    Draft,
}

impl std::str::FromStr for SpecMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(SpecMode::Off),
            "lookup" => Ok(SpecMode::Lookup),
            "draft" => Ok(SpecMode::Draft),
            other => Err(format!(
                "unknown speculation `{other}`: expected off, lookup or draft"
            )),
        }
    }
}

/// Speculative decoding: up to `k` proposed tokens verified in one forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecConfig {
    pub mode: SpecMode,
    /// Most tokens proposed per step (the adaptive k starts here). Default 8.
    pub k: usize,
    /// Speculation pauses while more sequences than this decode together (a batch already
    /// reads each weight once for several tokens). Default 2.
    pub max_batch: usize,
}

impl SpecConfig {
    /// Recurrent-state slots set aside as backups of speculating sequences' states (hybrid
    /// models), out of `spare` slots past the running ones (the snapshot pool's): one per
    /// sequence that may speculate at once.
    pub fn backup_slots(&self, spare: usize) -> usize {
        match self.mode {
            SpecMode::Off => 0,
            _ => self.max_batch.min(spare),
        }
    }
}

impl Default for SpecConfig {
    fn default() -> Self {
        Self {
            mode: SpecMode::Off,
            k: 8,
            max_batch: 2,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            chunk_size: 512,
            step_token_budget: 512,
            max_running: 4,
            ctx_size: 4096,
            spec: SpecConfig::default(),
        }
    }
}

impl EngineConfig {
    /// Checks the limits against each other and against the model's block size.
    pub fn validate(&self, model_block_size: usize) -> Result<(), ConfigError> {
        if self.block_size == 0 || self.block_size != model_block_size {
            return Err(ConfigError::BlockSize {
                config: self.block_size,
                model: model_block_size,
            });
        }
        for (name, v) in [
            ("chunk_size", self.chunk_size),
            ("max_running", self.max_running),
            ("ctx_size", self.ctx_size),
            ("spec.k", self.spec.k),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.step_token_budget < self.max_running {
            return Err(ConfigError::BudgetBelowRunning {
                budget: self.step_token_budget,
                max_running: self.max_running,
            });
        }
        Ok(())
    }

    /// The nearest valid configuration: block size from the model, zero limits raised to 1,
    /// the step budget raised to `max_running`.
    pub fn normalized(&self, model_block_size: usize) -> Self {
        let max_running = self.max_running.max(1);
        Self {
            block_size: model_block_size.max(1),
            chunk_size: self.chunk_size.max(1),
            step_token_budget: self.step_token_budget.max(max_running),
            max_running,
            ctx_size: self.ctx_size.max(1),
            spec: SpecConfig {
                k: self.spec.k.max(1),
                ..self.spec
            },
        }
    }
}
