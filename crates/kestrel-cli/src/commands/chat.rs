//! `kestrel chat`: an interactive conversation in the terminal. The KV cache stays between
//! turns; each turn renders the whole conversation and computes only the tokens after the
//! longest prefix already in the cache.

use crate::commands::run::{EngineArgs, SamplingArgs};
use crate::generate;
use anyhow::Result;
use kestrel_engine::GenerateRequest;
use kestrel_sampler::SamplingParams;
use serde_json::json;
use std::io::{BufRead, Write};

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens per answer at most.
    #[arg(short = 'n', long, default_value_t = 1024)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(args: ChatArgs) -> Result<()> {
    let src = args.engine.open_source()?;
    let template = generate::chat_template(&src)?;
    let tok = src.tokenizer.clone();
    let ctx = args.engine.context(&src)?;
    let engine = args.engine.engine(&src, ctx, false, false)?;
    let params = args.sampling.params();
    let seed = params
        .seed
        .unwrap_or_else(kestrel_sampler::rng::entropy_seed);
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    eprintln!("kestrel chat: type a message; an empty line or Ctrl-D ends.");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    for turn in 0u64.. {
        eprint!("> ");
        let Some(line) = lines.next().transpose()? else {
            break;
        };
        if line.trim().is_empty() {
            break;
        }
        messages.push(json!({"role": "user", "content": line}));
        // The whole conversation each turn: the engine's prefix cache holds every earlier
        // turn, so only the new tokens are computed.
        let rendered = template.apply(&messages, None, true)?;
        let prompt = tok.encode(&rendered, true, true)?;
        let max_tokens = args.max_tokens.min(ctx.saturating_sub(prompt.len()));
        if max_tokens == 0 {
            eprintln!("error: the conversation ({} tokens) fills the {ctx}-token context; start a new chat or raise --ctx-size", prompt.len());
            messages.pop();
            continue;
        }
        let req = GenerateRequest {
            prompt,
            max_tokens,
            sampling: SamplingParams {
                seed: Some(seed.wrapping_add(turn)),
                ..params.clone()
            },
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
        };
        let mut stdout = std::io::stdout().lock();
        let out = generate::generate(&engine, req, &mut |t| {
            let _ = stdout.write_all(t.as_bytes());
            let _ = stdout.flush();
        });
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                eprintln!("\nerror: {e:#}");
                messages.pop();
                continue;
            }
        };
        writeln!(stdout)?;
        let t = &out.timings;
        let spec = if t.spec_proposed > 0 {
            format!(
                " | speculation: {:.0}% of {} proposals kept, {:.2} tokens/step",
                t.acceptance_rate * 100.0,
                t.spec_proposed,
                t.tokens_per_step
            )
        } else {
            String::new()
        };
        eprintln!(
            "[{} new prompt tokens ({} reused), {:.1} tok/s | {} tokens, {:.1} tok/s{spec}]",
            t.prompt_n,
            t.cached_n,
            t.prompt_tok_s,
            out.tokens.len(),
            t.decode_tok_s
        );
        messages.push(json!({"role": "assistant", "content": out.text}));
    }
    Ok(())
}
