//! Typed errors.

use thiserror::Error;

/// Why a request was refused at submit. The messages say what would fit.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum SubmitError {
    #[error("empty prompt: at least one prompt token is needed")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("prompt token {id} at index {index} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { index: usize, id: u32, vocab: usize },
    #[error(
        "prompt ({prompt} tokens) + max_tokens ({max_tokens}) = {total} exceeds the context size \
         of {ctx_size} tokens; {hint}"
    )]
    ContextExceeded {
        prompt: usize,
        max_tokens: usize,
        total: usize,
        ctx_size: usize,
        hint: String,
    },
    #[error(
        "prompt ({prompt} tokens) + max_tokens ({max_tokens}) needs {needed_blocks} KV blocks of \
         {block_size} positions, the pool has {pool_blocks} ({pool_tokens} positions); {hint}"
    )]
    PoolTooSmall {
        prompt: usize,
        max_tokens: usize,
        needed_blocks: usize,
        block_size: usize,
        pool_blocks: usize,
        pool_tokens: usize,
        hint: String,
    },
    #[error("invalid sampling parameters: {0}")]
    Sampling(#[from] kestrel_sampler::SamplerError),
    #[error("the engine has shut down")]
    ShutDown,
}

/// An engine configuration that cannot work.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("block_size {config} must be non-zero and equal the model's block size {model}")]
    BlockSize { config: usize, model: usize },
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error(
        "step_token_budget {budget} is below max_running {max_running}: every running sequence \
         must be able to decode in each step"
    )]
    BudgetBelowRunning { budget: usize, max_running: usize },
    #[error("the model's KV pool has no blocks")]
    EmptyPool,
    #[error("{0}")]
    UnsupportedModel(String),
    #[error(
        "the model holds {slots} recurrent-state slots, fewer than max_running {max_running}: \
         every running sequence needs one"
    )]
    StateSlots { slots: usize, max_running: usize },
    #[error("speculative decoding: {0}")]
    Speculation(String),
}
