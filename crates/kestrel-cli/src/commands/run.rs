//! `kestrel run`: one completion, streamed to stdout (or one JSON object with `--json`).

use crate::generate;
use crate::source::ModelSource;
use anyhow::Result;
use kestrel_engine::GenerateRequest;
use kestrel_models::quantize::QuantMix;
use kestrel_models::{KvType, LoadOptions, MatmulPath};
use kestrel_sampler::SamplingParams;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

/// Sampling options shared by `run` and `chat` (defaults as llama.cpp's).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: u32,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty over the last 64 tokens; 1.0 = off.
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed of the sampler's RNG (random when absent).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

/// Model and engine options shared by `run` and `chat`.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    #[arg(short, long)]
    pub model: PathBuf,
    /// Threads (default: all cores).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Context size in tokens (default: 4096, or the model's maximum if smaller).
    #[arg(short = 'c', long)]
    pub ctx_size: Option<usize>,
    /// KV cache element type: f16, q8_0 (about half of f16) or f32.
    #[arg(long, default_value = "f16")]
    pub kv_type: String,
    /// Use the scalar f32 reference kernels (slow; the oracle for parity checks).
    #[arg(long)]
    pub reference: bool,
    /// cpu, cuda, cuda:N, or auto (the GPU when one is present and the plan fits there).
    #[arg(long, default_value = "auto")]
    pub device: String,
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
    /// Quantize a Hugging Face folder's weights as they load: q8_0, or q4_k (llama.cpp's
    /// Q4_K_M mixture); also q4_0, q5_k_m, q6_k. The memory plan counts the quantized sizes.
    #[arg(long, value_parser = parse_quant_mix)]
    pub quantize: Option<QuantMix>,
}

/// `--quantize` / `--type` values.
pub fn parse_quant_mix(s: &str) -> Result<QuantMix, String> {
    QuantMix::parse(s).ok_or_else(|| format!("'{s}': one of {}", QuantMix::NAMES))
}

impl EngineArgs {
    /// The model named by `-m`, with `--quantize` applied to its plan.
    pub fn open_source(&self) -> Result<ModelSource> {
        ModelSource::open(&self.model)?.quantized(self.quantize)
    }

    pub fn load_options(&self) -> LoadOptions {
        let mut o = LoadOptions {
            quantize: self.quantize,
            ..LoadOptions::default()
        };
        if let Some(t) = self.threads {
            o.threads = t.max(1);
        }
        if self.reference {
            o.matmul = MatmulPath::Reference;
        }
        o
    }

    pub fn device(&self) -> Result<crate::gpu::Device> {
        let d = crate::gpu::Device::parse(&self.device)?;
        // the scalar reference path is the CPU's
        Ok(if self.reference {
            crate::gpu::Device::Cpu
        } else {
            d
        })
    }

    /// The engine over the model on its device (the plan printed unless `quiet_plan`, the
    /// loading bar shown unless `quiet_load`).
    pub fn engine(
        &self,
        src: &ModelSource,
        ctx: usize,
        quiet_plan: bool,
        quiet_load: bool,
    ) -> Result<kestrel_engine::Engine> {
        let kv_type = self.kv_type(src)?;
        let spec = self.spec.config()?;
        let draft = self.spec.open_draft(src)?;
        let loaded = crate::gpu::step_model(
            src,
            draft.as_ref(),
            self.spec.device(self.device()?, quiet_plan)?,
            self.load_options(),
            ctx,
            1,
            kv_type,
            None,
            quiet_plan,
            quiet_load,
        )?;
        self.spec.note_backups(&loaded.plan, quiet_plan)?;
        crate::generate::start_engine(src, loaded, ctx, spec)
    }

    pub fn kv_type(&self, src: &ModelSource) -> Result<KvType> {
        parse_kv_type(&self.kv_type, src)
    }

    pub fn context(&self, src: &ModelSource) -> Result<usize> {
        let max = src.config.max_context;
        match self.ctx_size {
            Some(c) if c > max => {
                anyhow::bail!("--ctx-size {c} is above the model's maximum context {max}")
            }
            Some(0) => anyhow::bail!("--ctx-size must be positive"),
            Some(c) => Ok(c),
            None => Ok(max.min(4096)),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Prompt text.
    #[arg(short, long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long)]
    pub prompt_ids: Option<String>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Stop when this string is generated (repeatable); it is not printed.
    #[arg(long = "stop")]
    pub stops: Vec<String>,
    /// Keep going past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(args: RunArgs) -> Result<()> {
    let src = args.engine.open_source()?;
    let tok = &src.tokenizer;
    let prompt: Vec<u32> = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) => crate::parse_ids(ids)?,
        (Some(text), None) if args.chat => {
            let mut messages = Vec::new();
            if let Some(s) = &args.system {
                messages.push(json!({"role": "system", "content": s}));
            }
            messages.push(json!({"role": "user", "content": text}));
            let rendered = generate::chat_template(&src)?.apply(&messages, None, true)?;
            tok.encode(&rendered, true, true)?
        }
        (Some(text), None) => tok.encode(text, true, true)?,
        (None, None) => anyhow::bail!("give a prompt with -p TEXT or --prompt-ids 1,2,3"),
    };
    anyhow::ensure!(!prompt.is_empty(), "the prompt is empty");
    let ctx = args.engine.context(&src)?;
    let engine = args.engine.engine(&src, ctx, true, args.json)?;
    let max_tokens = args.max_tokens.min(ctx.saturating_sub(prompt.len()));
    anyhow::ensure!(
        max_tokens > 0,
        "the prompt has {} tokens; the context holds {ctx} (raise --ctx-size up to the model's maximum {})",
        prompt.len(),
        src.config.max_context
    );
    let params = args.sampling.params();
    let seed = params
        .seed
        .unwrap_or_else(kestrel_sampler::rng::entropy_seed);
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens,
        sampling: SamplingParams {
            seed: Some(seed),
            ..params
        },
        stop: args.stops.clone(),
        ignore_eos: args.ignore_eos,
        logprobs: None,
    };
    let mut stdout = std::io::stdout().lock();
    let out = if args.json {
        generate::generate(&engine, req, &mut |_| {})?
    } else {
        generate::generate(&engine, req, &mut |t| {
            let _ = stdout.write_all(t.as_bytes());
            let _ = stdout.flush();
        })?
    };
    let t = &out.timings;
    if args.json {
        let obj = json!({
            "prompt_tokens": prompt,
            "tokens": out.tokens,
            "text": out.text,
            "stop_reason": out.stop,
            "seed": seed,
            "timings": {
                "prompt_tok_s": t.prompt_tok_s,
                "decode_tok_s": t.decode_tok_s,
                "ttft_ms": t.ttft_ms,
                "e2e_tok_s": t.e2e_tok_s,
                "prompt_n": t.prompt_n,
                "decode_n": t.decode_n,
                "decode_steps": t.decode_steps,
                "tokens_per_step": t.tokens_per_step,
                "spec_proposed": t.spec_proposed,
                "spec_accepted": t.spec_accepted,
                "acceptance_rate": t.acceptance_rate,
            },
        });
        writeln!(stdout, "{obj}")?;
    } else {
        writeln!(stdout)?;
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s | ttft {:.0} ms | stop: {:?}",
            t.prompt_n, t.prompt_tok_s, t.decode_n, t.decode_tok_s, t.ttft_ms, out.stop
        );
        if t.spec_proposed > 0 {
            eprintln!(
                "speculation: {} of {} proposed tokens kept ({:.0}%), {:.2} tokens per step",
                t.spec_accepted,
                t.spec_proposed,
                t.acceptance_rate * 100.0,
                t.tokens_per_step
            );
        }
    }
    Ok(())
}

/// `--kv-type`: f16, q8_0 or f32, checked against the model's head size.
pub fn parse_kv_type(s: &str, src: &ModelSource) -> Result<KvType> {
    let ty = KvType::parse(s)
        .ok_or_else(|| anyhow::anyhow!("unknown --kv-type '{s}' (f16, q8_0 or f32)"))?;
    anyhow::ensure!(
        kestrel_models::KvPool::supports(ty, src.config.head_dim),
        "--kv-type {s} needs a head size that is a multiple of 32; this model's is {}",
        src.config.head_dim
    );
    Ok(ty)
}
