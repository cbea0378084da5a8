//! `kestrel serve`: the OpenAI-compatible HTTP server over the serving engine.
//! Prints the memory plan before loading; refuses a plan that cannot fit.

use crate::commands::run::EngineArgs;
use anyhow::{Context, Result};
use kestrel_engine::{Engine, EngineConfig};
use kestrel_sampler::SamplingParams;
use kestrel_server::{AppState, ServerConfig};
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to bind (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Sequences served at once.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Memory budget in bytes for weights + KV + scratch (default: 75% of available memory).
    #[arg(long)]
    pub max_memory: Option<u64>,
    /// Name clients use for the model (default: the file name without extension).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Sampling for requests that leave it out (OpenAI's defaults otherwise: temperature 1,
    /// top_p 1, no top_k / min_p / repeat penalty). Agent clients often send none: Qwen's
    /// recommended settings are `--temp 0.7 --top-p 0.8 --top-k 20 --repeat-penalty 1.05`.
    #[command(flatten)]
    pub sampling: SamplingDefaultArgs,
}

#[derive(clap::Args, Debug)]
pub struct SamplingDefaultArgs {
    /// Default temperature (0 = greedy).
    #[arg(long = "temp")]
    pub temperature: Option<f32>,
    /// Default nucleus sampling threshold.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Default top-k (0 = off).
    #[arg(long)]
    pub top_k: Option<u32>,
    /// Default min-p (0 = off).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Default repetition penalty (1 = off).
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
}

impl SamplingDefaultArgs {
    /// The server's defaults: OpenAI's, with what the operator set; checked like a request's.
    fn resolve(&self) -> Result<SamplingParams> {
        let d = kestrel_server::validate::openai_sampling_defaults();
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.unwrap_or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            ..d
        };
        p.validate()
            .map_err(|e| anyhow::anyhow!("default sampling: {e}"))?;
        Ok(p)
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    init_logging();
    let sampling_defaults = args.sampling.resolve()?;
    let src = args.engine.open_source()?;
    let ctx = args.engine.context(&src)?;
    let kv_type = args.engine.kv_type(&src)?;
    let name = args.model_name.clone().unwrap_or_else(|| {
        args.engine
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    // The plan comes from the config alone: printed, or refused, before any weight is loaded.
    let spec = args.engine.spec.config()?;
    let draft = args.engine.spec.open_draft(&src)?;
    let loaded = crate::gpu::step_model(
        &src,
        draft.as_ref(),
        args.engine.spec.device(args.engine.device()?, false)?,
        args.engine.load_options(),
        ctx,
        args.parallel,
        kv_type,
        args.max_memory,
        false,
        false,
    )?;
    args.engine.spec.note_backups(&loaded.plan, false)?;
    let cfg = EngineConfig {
        block_size: loaded.plan.block_size,
        max_running: args.parallel.max(1),
        ctx_size: ctx,
        step_token_budget: 512.max(args.parallel),
        spec,
        ..EngineConfig::default()
    };
    let engine =
        Engine::try_start_with_draft(loaded.model, loaded.draft, src.tokenizer.clone(), cfg)
            .map_err(|e| anyhow::anyhow!("engine configuration: {e}"))?;
    let config = ServerConfig {
        api_key: args.api_key.clone(),
        model_context: src.config.max_context,
        sampling_defaults: sampling_defaults.clone(),
        ..ServerConfig::new(name.clone(), ctx)
    };
    let tokenizer = src.tokenizer.clone();
    let state = AppState::new(config, Arc::new(engine), tokenizer)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "serving '{name}' on http://{addr}/v1 (ctx {ctx}, parallel {})",
            args.parallel
        );
        let d = &sampling_defaults;
        eprintln!(
            "sampling when a request leaves it out: temperature {}, top_p {}, top_k {}, min_p {}, repeat_penalty {}",
            d.temperature, d.top_p, d.top_k, d.min_p, d.repeat_penalty
        );
        kestrel_server::serve_with_shutdown(state, listener, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
        Ok(())
    })
}

/// Server logs on stderr: one line per finished request (tokens, cached tokens, TTFT) and the
/// errors. `RUST_LOG` overrides the level (e.g. `RUST_LOG=kestrel_server=debug`).
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("kestrel_server=info,warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
