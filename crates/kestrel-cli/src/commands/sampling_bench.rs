//! `kestrel bench --scenario sampling`: what the host spends picking one token, chain by chain,
//! on the model's own logits.
//!
//! A decode step on a GPU takes 1-2.5 ms; a draw over a 152k vocabulary used to take as long
//! again (OpenAI's defaults: no top-k, so the softmax of every entry). This measures it: the
//! prompt's logits and those of `-n` greedy steps after it (the model on the CPU), then each
//! chain's sampler over every row, `-r` times, timed per token (median of the rounds), beside
//! one read of a row (the argmax pass: the floor of anything that looks at every logit) and
//! the CPU's own decode step; then the same over the rows flattened (logits / 20: near-uniform,
//! as a random-weight model's, where a nucleus holds most of the vocabulary).
//! `scripts/sampling_peer.py MODEL` is the same on llama.cpp's sampler chain.

use crate::commands::bench::BenchArgs;
use crate::commands::scenarios::median;
use crate::source::ModelSource;
use anyhow::Result;
use kestrel_models::{KvType, LoadOptions, Logits};
use kestrel_sampler::{Sampler, SamplingParams};
use serde_json::json;
use std::time::Instant;

/// The prompt whose continuation gives the logits: ordinary code.
const PROMPT: &str =
    "def quicksort(items):\n    \"\"\"Sort a list of numbers in ascending order.\"\"\"\n";

/// The chains measured: (name, parameters, log-probabilities asked).
fn chains() -> Vec<(&'static str, SamplingParams, Option<usize>)> {
    let seed = Some(1);
    let openai = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..SamplingParams::default()
    };
    vec![
        ("greedy", SamplingParams::greedy(), None),
        (
            "llama.cpp defaults (t 0.8, top_k 40, top_p 0.95, min_p 0.05)",
            SamplingParams {
                seed,
                ..SamplingParams::default()
            },
            None,
        ),
        (
            "Qwen's (t 0.7, top_k 20, top_p 0.8, repeat 1.05)",
            SamplingParams {
                temperature: 0.7,
                top_k: 20,
                top_p: 0.8,
                min_p: 0.0,
                repeat_penalty: 1.05,
                seed,
                ..SamplingParams::default()
            },
            None,
        ),
        (
            "OpenAI defaults (t 1, top_p 1, no top_k)",
            openai.clone(),
            None,
        ),
        (
            "nucleus (t 0.7, top_p 0.8, no top_k)",
            SamplingParams {
                temperature: 0.7,
                top_p: 0.8,
                ..openai.clone()
            },
            None,
        ),
        ("OpenAI defaults + logprobs 5", openai, Some(5)),
    ]
}

pub fn run(args: &BenchArgs, opts: LoadOptions) -> Result<()> {
    let steps = args
        .gen
        .split(',')
        .next()
        .and_then(|n| n.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(32);
    let src = ModelSource::open(&args.model)?;
    let model = src.load_model(opts, true)?;
    let vocab = model.config.vocab_size;
    let prompt = src.tokenizer.encode(PROMPT, true, true)?;
    let mut cache = model.new_cache(prompt.len() + steps + 1, KvType::F16);
    let mut rows = vec![model.forward(&prompt, &mut cache, Logits::Last)?];
    let mut history = prompt.clone();
    let t0 = Instant::now();
    for _ in 0..steps {
        let next =
            kestrel_sampler::processors::greedy::argmax_logits(&rows[rows.len() - 1]).unwrap_or(0);
        history.push(next);
        rows.push(model.forward(&[next], &mut cache, Logits::Last)?);
    }
    let step_us = t0.elapsed().as_secs_f64() * 1e6 / steps as f64;
    let reps = args.reps.max(1);
    // the floor: one pass that reads every logit once
    let floor = median(
        &mut (0..reps)
            .map(|_| {
                let t = Instant::now();
                for r in &rows {
                    std::hint::black_box(kestrel_sampler::processors::greedy::argmax_logits(r));
                }
                t.elapsed().as_secs_f64() * 1e6 / rows.len() as f64
            })
            .collect::<Vec<_>>(),
    );
    let mut out = Vec::new();
    if !args.json {
        println!(
            "sampling one token, {} (vocabulary {vocab}), {} rows of its logits, {reps} rounds",
            args.model.display(),
            rows.len()
        );
        println!(
            "  one read of a row (argmax): {floor:.1} us; the CPU's decode step {step_us:.0} us"
        );
    }
    // the model's rows, then the same rows flattened: a near-uniform distribution (a
    // random-weight model's, or a step the model is unsure of), where a nucleus holds most of
    // the vocabulary
    let flat: Vec<Vec<f32>> = rows
        .iter()
        .map(|r| r.iter().map(|l| l / FLATTEN).collect())
        .collect();
    for (rows, shape) in [(&rows, "model"), (&flat, "flat")] {
        if !args.json && shape == "flat" {
            println!("  the same rows flattened (logits / {FLATTEN}):");
        }
        for (name, params, logprobs) in chains() {
            let mut sampler = Sampler::new(params, vocab)?;
            let us = median(
                &mut (0..reps)
                    .map(|_| {
                        let t = Instant::now();
                        for (i, r) in rows.iter().enumerate() {
                            let h = &history[..prompt.len() + i];
                            std::hint::black_box(sampler.sample(r, h));
                            if let Some(n) = logprobs {
                                std::hint::black_box(kestrel_sampler::token_logprobs(r, 0, n));
                            }
                        }
                        t.elapsed().as_secs_f64() * 1e6 / rows.len() as f64
                    })
                    .collect::<Vec<_>>(),
            );
            if args.json {
                out.push(
                    json!({"chain": name, "logits": shape, "us_per_token": us, "floor_us": floor}),
                );
            } else {
                println!(
                    "  {name:<62} {us:>8.1} us a token ({:.1}x the read)",
                    us / floor
                );
            }
        }
    }
    if args.json {
        println!(
            "{}",
            json!({"model": args.model.display().to_string(), "vocab": vocab,
                   "rows": rows.len(), "floor_us": floor, "cpu_step_us": step_us, "chains": out})
        );
    }
    Ok(())
}

/// What the flattened rows divide the logits by.
const FLATTEN: f32 = 20.0;
