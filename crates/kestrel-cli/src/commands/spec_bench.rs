//! `kestrel bench --spec lookup|draft`: speculative decoding on a code-editing workload, beside
//! plain decoding of the same requests. The prompt holds a ~150-line Python file
//! (data/inventory.py) and asks for the whole file back with one function renamed: what a coding
//! agent's edit looks like, and where most of the answer can be found in the prompt. Greedy, so
//! the speculative run must give the plain run's tokens; the table says whether it did.

use crate::commands::bench::BenchArgs;
use crate::gpu::Device;
use crate::source::ModelSource;
use anyhow::{anyhow, Result};
use kestrel_engine::{Engine, Event, GenerateRequest, SpecConfig, SpecMode, Usage};
use kestrel_models::{KvType, LoadOptions};
use kestrel_sampler::SamplingParams;
use serde_json::json;

const SOURCE: &str = include_str!("data/inventory.py");
const INSTRUCTION: &str = "Rename the method `total_value` to `inventory_value` everywhere in \
     this file. Reply with the whole updated file in one ```python block and nothing else.";

/// One mode's runs.
struct Measured {
    tokens: Vec<u32>,
    decode_tok_s: Vec<f64>,
    usage: Usage,
}

pub fn run(args: &BenchArgs, opts: LoadOptions) -> Result<()> {
    let src = ModelSource::open(&args.model)?;
    let spec = args.spec.config()?;
    let draft = args.spec.open_draft(&src)?;
    let prompt = edit_prompt(&src)?;
    let max_tokens = crate::commands::bench::list(&args.gen, "n")?
        .first()
        .copied()
        .filter(|&n| n > 0)
        .unwrap_or(2048);
    let ctx = (prompt.len() + max_tokens).min(src.config.max_context);
    let max_tokens = ctx.saturating_sub(prompt.len());
    anyhow::ensure!(
        max_tokens > 0,
        "the workload's prompt fills the model's context"
    );
    let threads = opts.threads;
    let say = if args.json {
        |s: String| eprintln!("{s}")
    } else {
        |s: String| println!("{s}")
    };
    say(format!(
        "workload: inventory.py ({} lines) + \"rename total_value\": prompt {} tokens, answer up to {max_tokens} tokens, greedy, {threads} threads, {} runs each",
        SOURCE.lines().count(),
        prompt.len(),
        args.reps
    ));

    let engine = |spec: SpecConfig, draft: Option<&ModelSource>| -> Result<Engine> {
        let loaded = crate::gpu::step_model(
            &src,
            draft,
            Device::Cpu,
            opts.clone(),
            ctx,
            1,
            KvType::F16,
            None,
            true,
            true,
        )?;
        crate::generate::start_engine(&src, loaded, ctx, spec)
    };
    let plain = measure(
        &engine(SpecConfig::default(), None)?,
        &prompt,
        max_tokens,
        args.reps,
    )?;
    let specd = measure(
        &engine(spec, draft.as_ref())?,
        &prompt,
        max_tokens,
        args.reps,
    )?;

    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (base, fast) = (median(&plain.decode_tok_s), median(&specd.decode_tok_s));
    let same = plain.tokens == specd.tokens;
    let t = crate::generate::timings(&specd.usage);
    let mode = match spec.mode {
        SpecMode::Lookup => format!("lookup (k <= {})", spec.k),
        SpecMode::Draft => format!(
            "draft {} (k <= {})",
            draft
                .as_ref()
                .and_then(|d| d.path.file_name())
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            spec.k
        ),
        SpecMode::Off => "off".into(),
    };
    if args.json {
        let obj = json!({
            "workload": "code-edit",
            "prompt_tokens": prompt.len(),
            "generated_tokens": specd.tokens.len(),
            "threads": threads,
            "plain_decode_tok_s": base,
            "spec_mode": mode,
            "spec_decode_tok_s": fast,
            "speedup": fast / base.max(1e-9),
            "acceptance_rate": t.acceptance_rate,
            "tokens_per_step": t.tokens_per_step,
            "spec_proposed": t.spec_proposed,
            "spec_accepted": t.spec_accepted,
            "same_tokens": same,
            "prompt_ids": prompt,
            "tokens": specd.tokens,
        });
        println!("{obj}");
    } else {
        println!(
            "{:<34} {:>10} {:>12} {:>10} {:>12} {:>8}",
            "mode", "tokens", "decode tok/s", "tok/step", "accepted", "speedup"
        );
        println!(
            "{:<34} {:>10} {:>12.1} {:>10.2} {:>12} {:>7.2}x",
            "plain",
            plain.tokens.len(),
            base,
            1.0,
            "-",
            1.0
        );
        println!(
            "{:<34} {:>10} {:>12.1} {:>10.2} {:>11.0}% {:>7.2}x",
            mode,
            specd.tokens.len(),
            fast,
            t.tokens_per_step,
            t.acceptance_rate * 100.0,
            fast / base.max(1e-9)
        );
        println!(
            "same tokens as plain decoding: {}",
            if same { "yes" } else { "NO" }
        );
    }
    anyhow::ensure!(same, "speculative decoding changed the greedy output");
    Ok(())
}

/// The workload's prompt through the model's chat template.
fn edit_prompt(src: &ModelSource) -> Result<Vec<u32>> {
    let user = format!("inventory.py:\n```python\n{SOURCE}```\n\n{INSTRUCTION}");
    let messages = vec![json!({"role": "user", "content": user})];
    let rendered = match src.tokenizer.chat_template()? {
        Some(t) => t.apply(&messages, None, true)?,
        None => format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"),
    };
    Ok(src.tokenizer.encode(&rendered, true, true)?)
}

/// `reps` greedy runs of the workload; the decode rate of each, the tokens and usage of the
/// last.
fn measure(engine: &Engine, prompt: &[u32], max_tokens: usize, reps: usize) -> Result<Measured> {
    let mut out = Measured {
        tokens: Vec::new(),
        decode_tok_s: Vec::new(),
        usage: Usage::default(),
    };
    for _ in 0..reps.max(1) {
        let mut h = engine
            .submit(GenerateRequest {
                prompt: prompt.to_vec(),
                max_tokens,
                sampling: SamplingParams::greedy(),
                stop: Vec::new(),
                ignore_eos: false,
                logprobs: None,
            })
            .map_err(|e| anyhow!("{e}"))?;
        let mut tokens = Vec::new();
        let usage = loop {
            match h.events.blocking_recv() {
                Some(Event::Token { id, .. }) => tokens.push(id),
                Some(Event::Done { usage, .. }) => break usage,
                Some(Event::Error { message }) => return Err(anyhow!(message)),
                None => return Err(anyhow!("the engine stopped")),
            }
        };
        out.decode_tok_s
            .push(crate::generate::timings(&usage).decode_tok_s);
        out.tokens = tokens;
        out.usage = usage;
    }
    Ok(out)
}
