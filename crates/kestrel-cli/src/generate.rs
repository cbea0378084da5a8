//! `run` and `chat` drive the same serving engine as the HTTP server: one request at a time,
//! streamed, with the engine's prefix cache carrying a conversation from turn to turn.

use crate::commands::info::human;
use crate::source::ModelSource;
use anyhow::{anyhow, Result};
use kestrel_engine::{
    plan_pool, Engine, EngineConfig, Event, FinishReason, GenerateRequest, PoolPlan, SpecConfig,
    Usage,
};
use kestrel_models::KvType;
use kestrel_tokenizer::ChatTemplate;

/// Positions per KV block.
pub const BLOCK_SIZE: usize = 16;

/// The KV pool for `ctx` tokens per sequence (plus the prefix reserve), from the config alone:
/// printed (unless `quiet`) or refused before any weight is loaded.
pub fn plan(
    src: &ModelSource,
    draft: Option<&ModelSource>,
    ctx: usize,
    parallel: usize,
    kv_type: KvType,
    max_memory: Option<u64>,
    quiet: bool,
) -> Result<PoolPlan> {
    let plan = plan_pool(
        &src.config,
        src.weight_bytes,
        ctx,
        parallel,
        BLOCK_SIZE,
        kv_type,
        max_memory,
        draft.map(|d| (&d.config, d.weight_bytes)),
    )
    .map_err(|e| anyhow!(e))?;
    if !quiet {
        eprintln!(
            "memory plan: weights {} + KV {} ({} blocks of {} tokens = {} tokens, {:?}){} + scratch = {}{}",
            human(src.weight_bytes + plan.draft_weight_bytes),
            human(plan.kv_bytes),
            plan.n_blocks,
            plan.block_size,
            plan.tokens,
            kv_type,
            if plan.state_bytes > 0 {
                format!(
                    " + recurrent state {} (with the snapshots' last logits {})",
                    human(plan.state_bytes + plan.snapshot_logits_bytes),
                    human(plan.snapshot_logits_bytes)
                )
            } else {
                String::new()
            },
            human(plan.total_bytes),
            plan.limit_bytes.map_or(String::new(), |l| format!(" (limit {})", human(l)))
        );
        if let Some(d) = draft {
            eprintln!(
                "draft model (counted above): {} weights {}{} + KV {} (its K/V in the same {} blocks)",
                d.path.display(),
                human(plan.draft_weight_bytes),
                d.draft_type()
                    .map_or(String::new(), |ty| format!(" (matrices held as {ty})")),
                human(plan.draft_kv_bytes),
                plan.n_blocks
            );
        }
        if let Some(m) = &src.config.moe {
            eprintln!(
                "experts: {} of {} per token; a decoded token reads {} of the weights",
                m.n_used,
                m.n_experts,
                human(src.read_bytes_per_token)
            );
        }
        if plan.state_slot_bytes > 0 {
            eprintln!(
                "recurrent state: {} per sequence x {} running + {} snapshots (at most {} per sequence; each keeps its prompt's last logits, {}) = {}",
                human(plan.state_slot_bytes as u64),
                plan.running_slots,
                plan.snapshot_slots,
                plan.snapshots_per_seq,
                human(plan.snapshot_logits_bytes / plan.snapshot_slots.max(1) as u64),
                human(plan.state_bytes + plan.snapshot_logits_bytes)
            );
        }
        eprintln!("kernels: {}", kestrel_quant::kernels_summary());
    }
    Ok(plan)
}

/// Starts an engine over a loaded model (on its device, with its planned pool and its draft
/// model, if any), one sequence at a time.
pub fn start_engine(
    src: &ModelSource,
    loaded: crate::gpu::Loaded,
    ctx: usize,
    spec: SpecConfig,
) -> Result<Engine> {
    let cfg = EngineConfig {
        block_size: loaded.plan.block_size,
        max_running: 1,
        ctx_size: ctx,
        spec,
        ..EngineConfig::default()
    };
    Engine::try_start_with_draft(loaded.model, loaded.draft, src.tokenizer.clone(), cfg)
        .map_err(|e| anyhow!("engine configuration: {e}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An end-of-generation token or a stop string.
    Stop,
    MaxTokens,
    Cancelled,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Timings {
    /// Prompt tokens actually computed (the rest came from the cache).
    pub prompt_n: usize,
    pub cached_n: usize,
    pub prompt_tok_s: f64,
    /// Decode steps (one per generated token after the first).
    pub decode_n: usize,
    pub decode_tok_s: f64,
    pub ttft_ms: f64,
    /// Generated tokens per second including prefill.
    pub e2e_tok_s: f64,
    /// Forward steps of the decode (`decode_n` without speculation).
    pub decode_steps: usize,
    /// Speculative decoding: tokens proposed and kept, the kept fraction, and generated
    /// tokens per decode step.
    pub spec_proposed: usize,
    pub spec_accepted: usize,
    pub acceptance_rate: f64,
    pub tokens_per_step: f64,
}

pub struct Output {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
    pub timings: Timings,
}

/// Runs one request to its end, passing text to `on_text` as it becomes final.
pub fn generate(
    engine: &Engine,
    req: GenerateRequest,
    on_text: &mut dyn FnMut(&str),
) -> Result<Output> {
    let mut handle = engine.submit(req).map_err(|e| anyhow!("{e}"))?;
    let mut tokens = Vec::new();
    let mut text = String::new();
    loop {
        match handle.events.blocking_recv() {
            Some(Event::Token {
                id, text: piece, ..
            }) => {
                tokens.push(id);
                if !piece.is_empty() {
                    on_text(&piece);
                    text.push_str(&piece);
                }
            }
            Some(Event::Done { finish, usage }) => {
                let stop = match finish {
                    FinishReason::Stop => StopReason::Stop,
                    FinishReason::Length => StopReason::MaxTokens,
                    FinishReason::Cancelled => StopReason::Cancelled,
                };
                return Ok(Output {
                    tokens,
                    text,
                    stop,
                    timings: timings(&usage),
                });
            }
            Some(Event::Error { message }) => return Err(anyhow!("generation failed: {message}")),
            None => return Err(anyhow!("the engine stopped before the request finished")),
        }
    }
}

pub fn timings(u: &Usage) -> Timings {
    let computed = u.prompt_tokens - u.cached_tokens;
    let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    let decode_n = u.completion_tokens.saturating_sub(1);
    Timings {
        prompt_n: computed,
        cached_n: u.cached_tokens,
        prompt_tok_s: per_s(computed, u.ttft_ms),
        decode_n,
        decode_tok_s: per_s(decode_n, u.decode_ms),
        ttft_ms: u.ttft_ms,
        e2e_tok_s: per_s(u.completion_tokens, u.ttft_ms + u.decode_ms),
        decode_steps: u.decode_steps,
        spec_proposed: u.spec_proposed,
        spec_accepted: u.spec_accepted,
        acceptance_rate: if u.spec_proposed > 0 {
            u.spec_accepted as f64 / u.spec_proposed as f64
        } else {
            0.0
        },
        tokens_per_step: if u.decode_steps > 0 {
            decode_n as f64 / u.decode_steps as f64
        } else {
            0.0
        },
    }
}

/// The model's chat template, or a clear error when it has none.
pub fn chat_template(src: &ModelSource) -> Result<ChatTemplate> {
    src.tokenizer
        .chat_template()?
        .ok_or_else(|| anyhow!("{} has no chat template", src.path.display()))
}
