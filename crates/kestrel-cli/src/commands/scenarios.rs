//! `kestrel bench --scenario agent|concurrent`: the serving engine under the traffic kestrel is
//! built for.
//!
//! - agent: a replayed coding-agent conversation (agent_conversation.json: a ~3k-token system +
//!   tools prefix, then five user turns; earlier assistant replies are replayed, not generated).
//!   Each turn's time to first token through the engine with its prefix cache (warm) and with
//!   nothing to reuse (cold: the prompt's first token changed, so no cached prefix matches). Then a
//!   4,000-token prefix + 100 new tokens, cold and warm (the peer's published case).
//! - concurrent: for each concurrency c, c requests (128-token prompts, 64 new tokens each) at
//!   once, their prompts prefilled (cached) beforehand as llama-batched-bench does; aggregate
//!   decode tok/s = sum of decode tokens / the longest decode time.

use crate::commands::bench::BenchArgs;
use crate::source::ModelSource;
use anyhow::{anyhow, Result};
use kestrel_engine::{Engine, EngineConfig, Event, GenerateRequest, Usage};
use kestrel_models::{KvType, LoadOptions};
use kestrel_sampler::SamplingParams;
use serde_json::{json, Value};
use std::time::Instant;

const CONVERSATION: &str = include_str!("agent_conversation.json");
/// ChatML with the tools listed in the system turn, for files without a chat template.
const CHATML: &str = "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}{%- for m in messages %}{%- if not (tools and loop.first and m.role == 'system') %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The serving engine on the bench's device (`--device`), as `serve` builds it: the model's
/// pool planned for `parallel` sequences of `ctx` tokens.
fn engine_for(
    src: &ModelSource,
    args: &BenchArgs,
    opts: LoadOptions,
    ctx: usize,
    parallel: usize,
) -> Result<Engine> {
    let loaded = crate::gpu::step_model(
        src,
        None,
        crate::gpu::Device::parse(&args.device)?,
        opts,
        ctx,
        parallel,
        KvType::F16,
        None,
        true,
        true,
    )?;
    let cfg = EngineConfig {
        block_size: loaded.plan.block_size,
        max_running: parallel,
        ctx_size: ctx,
        step_token_budget: 512.max(parallel),
        ..EngineConfig::default()
    };
    Engine::try_start(loaded.model, src.tokenizer.clone(), cfg).map_err(|e| anyhow!("{e}"))
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        ignore_eos: true,
        logprobs: None,
    }
}

fn finish(mut h: kestrel_engine::RequestHandle) -> Result<Usage> {
    loop {
        match h.events.blocking_recv() {
            Some(Event::Token { .. }) => {}
            Some(Event::Done { usage, .. }) => return Ok(usage),
            Some(Event::Error { message }) => return Err(anyhow!(message)),
            None => return Err(anyhow!("engine stopped")),
        }
    }
}

/// Time to first token with nothing to reuse: the same prompt with its first token changed
/// (by `salt`, distinct per call, so cold runs share no prefix with each other either), through
/// the same engine: the whole prompt is prefilled.
fn cold_ttft_ms(engine: &Engine, prompt: &[u32], vocab: usize, salt: usize) -> Result<f64> {
    let mut cold = prompt.to_vec();
    if let Some(first) = cold.first_mut() {
        *first = ((*first as usize + salt) % vocab) as u32;
    }
    let usage = finish(
        engine
            .submit(request(cold, 1))
            .map_err(|e| anyhow!("{e}"))?,
    )?;
    anyhow::ensure!(
        usage.cached_tokens == 0,
        "the cold request reused {} cached tokens",
        usage.cached_tokens
    );
    Ok(usage.ttft_ms)
}

pub fn agent(args: &BenchArgs, opts: LoadOptions) -> Result<()> {
    let src = ModelSource::open(&args.model)?;
    let conv: Value = serde_json::from_str(CONVERSATION)?;
    let template = match src.tokenizer.chat_template()? {
        Some(t) => t,
        None => {
            // Random-weight files of real shapes carry a bare vocabulary: replay the
            // conversation through plain ChatML (the Qwen families' format).
            eprintln!("no chat template in the file: the conversation is rendered as ChatML");
            kestrel_tokenizer::ChatTemplate::new(CHATML, "", "<|im_end|>")?
        }
    };
    let tools = conv["tools"].as_array().cloned().unwrap_or_default();
    let ctx = 8192.min(src.config.max_context);
    let vocab = src.config.vocab_size;
    // Room for two prompts: a turn's cold run must not evict the warm conversation's blocks.
    let engine = engine_for(&src, args, opts, ctx, 2)?;

    let mut messages = vec![json!({"role": "system", "content": conv["system"]})];
    let mut turns = Vec::new();
    let mut prev_len = 0usize;
    println!(
        "{:<6} {:>8} {:>8} {:>8} {:>12} {:>12} {:>8}",
        "turn", "prompt", "new", "cached", "TTFT warm ms", "TTFT cold ms", "speedup"
    );
    for (i, turn) in conv["turns"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        messages.push(json!({"role": "user", "content": turn["user"]}));
        let rendered = template.apply(&messages, Some(&tools), true)?;
        let prompt = src.tokenizer.encode(&rendered, true, true)?;
        let usage = finish(
            engine
                .submit(request(prompt.clone(), 1))
                .map_err(|e| anyhow!("{e}"))?,
        )?;
        let cold = cold_ttft_ms(&engine, &prompt, vocab, i + 1)?;
        println!(
            "{:<6} {:>8} {:>8} {:>8} {:>12.0} {:>12.0} {:>7.1}x",
            i + 1,
            prompt.len(),
            prompt.len() - prev_len.min(prompt.len()),
            usage.cached_tokens,
            usage.ttft_ms,
            cold,
            cold / usage.ttft_ms.max(1e-9)
        );
        turns.push(json!({
            "turn": i + 1, "prompt_tokens": prompt.len(), "new_tokens": prompt.len() - prev_len.min(prompt.len()),
            "cached_tokens": usage.cached_tokens, "ttft_warm_ms": usage.ttft_ms, "ttft_cold_ms": cold,
        }));
        prev_len = prompt.len();
        if let Some(a) = turn["assistant"].as_str() {
            messages.push(json!({"role": "assistant", "content": a}));
        }
    }

    // The peer's case: a 4,000-token prefix, then the same prefix + 100 new tokens.
    let mut long = src
        .tokenizer
        .encode(conv["system"].as_str().unwrap_or_default(), true, true)?;
    while long.len() < 4100 {
        let again = long.clone();
        long.extend_from_slice(&again[..again.len().min(4100 - long.len())]);
    }
    let prefix = long[..4000].to_vec();
    let full = long[..4100].to_vec();
    finish(
        engine
            .submit(request(prefix, 1))
            .map_err(|e| anyhow!("{e}"))?,
    )?;
    let warm = finish(
        engine
            .submit(request(full.clone(), 1))
            .map_err(|e| anyhow!("{e}"))?,
    )?;
    let cold = cold_ttft_ms(&engine, &full, vocab, turns.len() + 1)?;
    let speedup = cold / warm.ttft_ms.max(1e-9);
    println!(
        "4,000-token prefix + 100 new: TTFT cold {:.0} ms, warm {:.0} ms ({} cached): {:.1}x",
        cold, warm.ttft_ms, warm.cached_tokens, speedup
    );
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "model": args.model.display().to_string(),
                "turns": turns,
                "ttft_cold_4k_100_ms": cold,
                "ttft_warm_4k_100_ms": warm.ttft_ms,
                "ttft_speedup_4k_100": speedup,
            }))?
        );
    }
    engine.check_idle_accounting().map_err(|e| anyhow!(e))?;
    Ok(())
}

pub fn concurrent(args: &BenchArgs, opts: LoadOptions) -> Result<()> {
    let src = ModelSource::open(&args.model)?;
    let levels: Vec<usize> = args
        .concurrency
        .split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| anyhow!("-c: '{x}' is not a number"))
        })
        .collect::<Result<_>>()?;
    let max_c = levels.iter().copied().max().unwrap_or(1).max(1);
    let engine = engine_for(&src, args, opts, 256, max_c)?;
    let vocab = src.config.vocab_size as u64;
    let mut rows = Vec::new();
    println!(
        "{:>4} {:>18} {:>14} {:>10} {:>14} {:>14}",
        "c", "aggregate decode", "per sequence", "wall s", "forward/step", "engine/step"
    );
    // One unmeasured round first (page faults, thread pool start), then `-r` rounds per level:
    // the median is reported, as the peer script does.
    let reps = args.reps.max(1);
    let mut first = true;
    for &c in &levels {
        let (mut aggs, mut walls, mut fwd, mut eng) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for rep in 0..reps + usize::from(first) {
            let r = concurrent_round(&engine, c, rep, vocab)?;
            if first {
                first = false;
                continue;
            }
            aggs.push(r.aggregate);
            walls.push(r.wall);
            fwd.push(r.forward_ms_per_step);
            eng.push(r.engine_ms_per_step);
        }
        let agg = median(&mut aggs);
        let wall = median(&mut walls);
        let (fwd, eng) = (median(&mut fwd), median(&mut eng));
        println!(
            "{c:>4} {agg:>14.1} tok/s {:>10.1} tok/s {wall:>10.2} {fwd:>11.2} ms {eng:>11.2} ms",
            agg / c as f64
        );
        rows.push(
            json!({"concurrency": c, "aggregate_decode_tok_s": agg, "wall_s": wall,
            "forward_ms_per_step": fwd, "engine_ms_per_step": eng}),
        );
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"model": args.model.display().to_string(), "levels": rows})
            )?
        );
    }
    engine.check_idle_accounting().map_err(|e| anyhow!(e))?;
    Ok(())
}

/// What one round of `--scenario concurrent` measured.
struct Round {
    /// Generated tokens after each sequence's first, per second of the longest decode.
    aggregate: f64,
    wall: f64,
    /// Per engine step of the generation phase: time inside the model's forward pass (its
    /// logits downloaded included), and the engine's own work on them (sampling, streaming).
    forward_ms_per_step: f64,
    engine_ms_per_step: f64,
}

/// One measured round of `c` concurrent requests (distinct 128-token prompts cached first, then
/// 64 new tokens each, decoded together).
fn concurrent_round(
    engine: &kestrel_engine::Engine,
    c: usize,
    rep: usize,
    vocab: u64,
) -> Result<Round> {
    // A distinct 128-token prompt per sequence and round (no prefix sharing).
    let prompts: Vec<Vec<u32>> = (0..c)
        .map(|i| {
            let mut x = 0x9E3779B97F4A7C15u64 ^ ((rep * 100_000 + c * 1000 + i) as u64);
            (0..128)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % (vocab * 9 / 10)) as u32
                })
                .collect()
        })
        .collect();
    // As llama-batched-bench: prompts first (here: one token each, which caches them),
    // then the measured generation phase.
    let warm: Vec<_> = prompts
        .iter()
        .map(|p| {
            engine
                .submit(request(p.clone(), 1))
                .map_err(|e| anyhow!("{e}"))
        })
        .collect::<Result<_>>()?;
    warm.into_iter().map(finish).collect::<Result<Vec<_>>>()?;
    let before = engine.stats();
    let t0 = Instant::now();
    let handles: Vec<_> = prompts
        .into_iter()
        .map(|p| engine.submit(request(p, 64)).map_err(|e| anyhow!("{e}")))
        .collect::<Result<_>>()?;
    let usages: Vec<Usage> = handles.into_iter().map(finish).collect::<Result<_>>()?;
    let wall = t0.elapsed().as_secs_f64();
    let tokens: usize = usages
        .iter()
        .map(|u| u.completion_tokens.saturating_sub(1))
        .sum();
    let longest = usages.iter().map(|u| u.decode_ms).fold(0.0, f64::max);
    let after = engine.stats();
    let steps = (after.forward_steps - before.forward_steps).max(1) as f64;
    Ok(Round {
        aggregate: tokens as f64 * 1e3 / longest.max(1e-9),
        wall,
        forward_ms_per_step: (after.forward_ns - before.forward_ns) as f64 * 1e-6 / steps,
        engine_ms_per_step: (after.sample_ns - before.sample_ns) as f64 * 1e-6 / steps,
    })
}

/// The middle of `v` once sorted (0 for none).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}
