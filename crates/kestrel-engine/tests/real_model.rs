//! The engine on a real model (SmolLM2-135M): concurrent greedy requests equal the same
//! requests run alone, steps really batch several sequences, and a shared 1,024-token prefix
//! is reused (counted from what the model's forward passes actually ran).

use kestrel_engine::{Engine, EngineConfig, Event, FinishReason, GenerateRequest, Usage};
use kestrel_models::{KvType, LoadOptions, Model, PagedModel};
use kestrel_sampler::SamplingParams;
use kestrel_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn model_path() -> Option<PathBuf> {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-135m-instruct-q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    if std::env::var("KESTREL_REQUIRE_MODELS").is_ok_and(|v| v == "1") {
        panic!("{} is missing (run scripts/fetch-models.sh)", p.display());
    }
    eprintln!("skipping: {} not fetched", p.display());
    None
}

fn start(parallel: usize, n_blocks: usize) -> Option<(Engine, Arc<Tokenizer>, Arc<AtomicU64>)> {
    let path = model_path()?;
    let file = kestrel_gguf::GgufFile::open(&path).expect("open");
    let tok = Arc::new(Tokenizer::from_gguf(&file.header).expect("tokenizer"));
    let opts = LoadOptions {
        threads: 2,
        ..LoadOptions::default()
    };
    let model = Model::from_gguf(&file, opts, &mut |_, _| {}).expect("model");
    let paged = PagedModel::new(model, n_blocks, 16, KvType::F16);
    let computed = paged.tokens_computed.clone();
    let cfg = EngineConfig {
        max_running: parallel,
        ctx_size: 2048,
        ..EngineConfig::default()
    };
    Some((
        Engine::start(Box::new(paged), tok.clone(), cfg),
        tok,
        computed,
    ))
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        ignore_eos: true,
        logprobs: None,
    }
}

/// Drains a request's events: (tokens, usage, finish).
fn collect(mut h: kestrel_engine::RequestHandle) -> (Vec<u32>, Usage, FinishReason) {
    let mut tokens = Vec::new();
    loop {
        match h.events.blocking_recv() {
            Some(Event::Token { id, .. }) => tokens.push(id),
            Some(Event::Done { finish, usage }) => return (tokens, usage, finish),
            Some(Event::Error { message }) => panic!("engine error: {message}"),
            None => panic!("event stream closed early"),
        }
    }
}

const PROMPTS: [&str; 8] = [
    "def fibonacci(n):",
    "The capital of France is",
    "Write a haiku about the sea.",
    "fn main() {\n    let v = vec![1, 2, 3];",
    "SELECT name FROM users WHERE",
    "Once upon a time, in a small village,",
    "import numpy as np\n\ndef normalize(x):",
    "The three laws of thermodynamics are",
];

#[test]
fn concurrent_greedy_requests_equal_solo_runs_and_batch() {
    let Some((engine, tok, _)) = start(8, 512) else {
        return;
    };
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| tok.encode(p, true, true).unwrap())
        .collect();
    // Alone, one after another.
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| collect(engine.submit(greedy(p.clone(), 24)).unwrap()).0)
        .collect();
    let before = engine.stats();
    // All at once.
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(greedy(p.clone(), 24)).unwrap())
        .collect();
    let together: Vec<Vec<u32>> = handles.into_iter().map(|h| collect(h).0).collect();
    assert_eq!(
        solo, together,
        "batched greedy outputs differ from solo runs"
    );
    let after = engine.stats();
    assert!(
        after.max_step_seqs >= 4,
        "steps never batched several sequences (max {} per step)",
        after.max_step_seqs
    );
    assert!(
        after.forward_steps - before.forward_steps < 8 * 24,
        "the concurrent run did not share steps"
    );
    engine.check_idle_accounting().expect("pool accounting");
}

#[test]
fn shared_1024_token_prefix_is_reused() {
    let Some((engine, tok, computed)) = start(2, 512) else {
        return;
    };
    // A long shared prefix (system prompt + "files"), then two different questions.
    let mut prefix = String::from("You are a careful coding assistant. Here is the repository:\n");
    let mut i = 0;
    while tok.encode(&prefix, true, true).unwrap().len() < 1100 {
        prefix += &format!("fn helper_{i}(x: u32) -> u32 {{ x.wrapping_mul({i}) + 7 }}\n");
        i += 1;
    }
    let prefix_ids: Vec<u32> = tok.encode(&prefix, true, true).unwrap()[..1024].to_vec();
    let mut first = prefix_ids.clone();
    first.extend(
        tok.encode("\nQuestion: what does helper_3 return for 2?", false, true)
            .unwrap(),
    );
    let mut second = prefix_ids.clone();
    second.extend(
        tok.encode("\nQuestion: which helper multiplies by 5?", false, true)
            .unwrap(),
    );

    let (_, u1, _) = collect(engine.submit(greedy(first, 8)).unwrap());
    assert_eq!(u1.cached_tokens, 0);
    let ran_before = computed.load(Ordering::Relaxed);
    let (toks, u2, _) = collect(engine.submit(greedy(second.clone(), 8)).unwrap());
    let ran = computed.load(Ordering::Relaxed) - ran_before;
    assert!(
        u2.cached_tokens >= 1000,
        "only {} cached tokens reported",
        u2.cached_tokens
    );
    // What the forward passes really ran: the uncached prompt tokens, then one per decode step
    // (the last generated token is never fed back).
    let expected = (second.len() - u2.cached_tokens) as u64 + (toks.len() as u64 - 1);
    assert_eq!(
        ran, expected,
        "model computed {ran} tokens; expected {expected}"
    );
    engine.check_idle_accounting().expect("pool accounting");
}
