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
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            chunk_size: 512,
            step_token_budget: 512,
            max_running: 4,
            ctx_size: 4096,
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
        }
    }
}
