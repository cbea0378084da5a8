//! `kestrel chat`: an interactive conversation in the terminal. The KV cache stays between
//! turns; each turn renders the whole conversation and computes only the tokens after the
//! longest prefix already in the cache.

use crate::commands::run::{EngineArgs, SamplingArgs};
use crate::generate::{self, Request};
use crate::source::ModelSource;
use anyhow::Result;
use kestrel_sampler::Sampler;
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
    let src = ModelSource::open(&args.engine.model)?;
    let template = generate::chat_template(&src)?;
    let tok = &src.tokenizer;
    let ctx = args.engine.context(&src)?;
    let model = src.load_model(args.engine.load_options(), false)?;
    let mut cache = model.new_cache(ctx, args.engine.kv_type(&src)?);
    let mut sampler = Sampler::new(args.sampling.params(), src.config.vocab_size)?;
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    // Tokens whose K/V the cache holds, in order.
    let mut cached: Vec<u32> = Vec::new();
    eprintln!("kestrel chat: type a message; an empty line or Ctrl-D ends.");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next().transpose()? else {
            break;
        };
        if line.trim().is_empty() {
            break;
        }
        messages.push(json!({"role": "user", "content": line}));
        let rendered = template.apply(&messages, None, true)?;
        let prompt = tok.encode(&rendered, true, true)?;
        let common = cached
            .iter()
            .zip(&prompt)
            .take_while(|(a, b)| a == b)
            .count();
        cache.truncate(common);
        let req = Request {
            prompt: &prompt,
            max_tokens: args.max_tokens,
            stops: &[],
            ignore_eos: false,
        };
        let mut stdout = std::io::stdout().lock();
        let out = generate::generate(&model, tok, &mut cache, &mut sampler, &req, &mut |t| {
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
        eprintln!(
            "[{} new prompt tokens ({} reused), {:.1} tok/s | {} tokens, {:.1} tok/s]",
            t.prompt_n,
            prompt.len() - t.prompt_n,
            t.prompt_tok_s,
            out.tokens.len(),
            t.decode_tok_s
        );
        cached = prompt;
        cached.extend(&out.tokens);
        cached.truncate(cache.len());
        messages.push(json!({"role": "assistant", "content": out.text}));
    }
    Ok(())
}
