//! The engine through its public API: the scheduler thread, submit-time refusal, streaming,
//! cancellation by dropping the handle, model errors, stats, and the idle leak check.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel_engine::mock::MockModel;
use kestrel_engine::{
    Engine, EngineConfig, Event, FinishReason, GenerateRequest, SubmitError, Usage,
};
use kestrel_sampler::SamplingParams;
use kestrel_tokenizer::Tokenizer;

const VOCAB: usize = 512;

fn tokenizer() -> Arc<Tokenizer> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-tokenizer");
    Arc::new(Tokenizer::from_hf_dir(dir).expect("test tokenizer"))
}

fn next(pos: usize, last: u32) -> u32 {
    10 + ((pos as u32).wrapping_mul(7).wrapping_add(last)) % 480
}

fn engine(model: MockModel, cfg: EngineConfig) -> Engine {
    Engine::try_start(Box::new(model), tokenizer(), cfg).expect("engine")
}

fn cfg() -> EngineConfig {
    EngineConfig {
        block_size: 16,
        chunk_size: 64,
        step_token_budget: 64,
        max_running: 4,
        ctx_size: 1024,
        spec: Default::default(),
    }
}

fn req(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        ignore_eos: true,
        logprobs: None,
    }
}

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 3 + (i * 31 + seed * 97) % 400)
        .collect()
}

/// Reads events to the end: (token ids, finish, usage) or the error message.
fn collect(
    mut h: kestrel_engine::RequestHandle,
) -> Result<(Vec<u32>, FinishReason, Usage), String> {
    let mut ids = Vec::new();
    while let Some(ev) = h.events.blocking_recv() {
        match ev {
            Event::Token { id, .. } => ids.push(id),
            Event::Done { finish, usage } => return Ok((ids, finish, usage)),
            Event::Error { message } => return Err(message),
        }
    }
    Err("stream ended without Done".to_string())
}

#[test]
fn refuses_what_can_never_fit_with_a_message() {
    let e = engine(MockModel::new(VOCAB, 32, 16, next), cfg()); // 512 positions
    let err = e.submit(req(prompt(1, 1000), 100)).unwrap_err();
    assert!(matches!(err, SubmitError::ContextExceeded { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("1024") && msg.contains("max_tokens = 24"),
        "{msg}"
    );

    let err = e.submit(req(prompt(1, 500), 100)).unwrap_err();
    assert!(matches!(err, SubmitError::PoolTooSmall { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("512 positions") && msg.contains("max_tokens = 12"),
        "{msg}"
    );

    assert_eq!(
        e.submit(req(vec![], 5)).unwrap_err(),
        SubmitError::EmptyPrompt
    );
    assert_eq!(
        e.submit(req(vec![1], 0)).unwrap_err(),
        SubmitError::ZeroMaxTokens
    );
    assert!(matches!(
        e.submit(req(vec![1, 9999], 5)).unwrap_err(),
        SubmitError::TokenOutOfRange {
            index: 1,
            id: 9999,
            ..
        }
    ));
    let mut bad = req(vec![1], 5);
    bad.sampling.temperature = -1.0;
    assert!(matches!(
        e.submit(bad).unwrap_err(),
        SubmitError::Sampling(_)
    ));
    assert_eq!(e.stats().requests, 0);
    e.check_idle_accounting().unwrap();
}

#[test]
fn rejects_bad_config() {
    let mut c = cfg();
    c.block_size = 32;
    assert!(
        Engine::try_start(Box::new(MockModel::new(VOCAB, 8, 16, next)), tokenizer(), c).is_err()
    );
    let mut c = cfg();
    c.step_token_budget = 2;
    assert!(Engine::try_start(
        Box::new(MockModel::new(VOCAB, 8, 16, next)),
        tokenizer(),
        c.clone()
    )
    .is_err());
    // `start` normalizes instead.
    let e = Engine::start(Box::new(MockModel::new(VOCAB, 8, 16, next)), tokenizer(), c);
    assert_eq!(e.config().step_token_budget, 4);
}

#[test]
fn concurrent_requests_stream_to_the_end_and_leave_no_leak() {
    let model = MockModel::new(VOCAB, 256, 16, next);
    let log = model.log();
    let e = engine(model, cfg());
    let handles: Vec<_> = (0..6)
        .map(|i| e.submit(req(prompt(i, 50 + 30 * i as usize), 20)).unwrap())
        .collect();
    for h in handles {
        let (ids, finish, usage) = collect(h).unwrap();
        assert_eq!(
            (ids.len(), finish, usage.completion_tokens),
            (20, FinishReason::Length, 20)
        );
        assert!(usage.ttft_ms >= 0.0 && usage.decode_ms >= 0.0);
    }
    e.check_idle_accounting().unwrap();
    let st = e.stats();
    assert_eq!(
        (
            st.requests,
            st.requests_finished,
            st.running,
            st.queue_depth
        ),
        (6, 6, 0, 0)
    );
    assert_eq!(st.generated_tokens, 120);
    assert_eq!(st.blocks_used, 0);
    assert_eq!(st.blocks_free + st.blocks_cached, 256);
    assert!(st.max_step_seqs >= 2, "steps batched several sequences");
    // Prompt tokens computed = the prefill steps the model saw (no prefix shared here).
    let prefill: u64 = log
        .lock()
        .unwrap()
        .steps
        .iter()
        .flatten()
        .filter(|r| {
            let i = (0..6u32)
                .find(|&i| r.context[0] == prompt(i, 1)[0])
                .unwrap();
            r.start < 50 + 30 * i as usize
        })
        .map(|r| r.tokens.len() as u64)
        .sum();
    assert_eq!(st.computed_prompt_tokens, prefill);
    assert_eq!(
        st.computed_prompt_tokens,
        (0..6).map(|i| 50 + 30 * i).sum::<u64>()
    );
}

#[test]
fn dropping_the_handle_cancels_within_a_step() {
    let model = MockModel::new(VOCAB, 64, 16, next).with_delay(Duration::from_millis(2));
    let log = model.log();
    let e = engine(model, cfg());
    let mut h = e.submit(req(prompt(7, 40), 500)).unwrap();
    // Wait for a few tokens, then drop the handle.
    for _ in 0..3 {
        assert!(matches!(
            h.events.blocking_recv(),
            Some(Event::Token { .. })
        ));
    }
    drop(h);
    let t = Instant::now();
    e.check_idle_accounting().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2));
    let st = e.stats();
    assert_eq!(st.requests_cancelled, 1);
    assert!(log.lock().unwrap().steps.len() < 100, "work stopped early");
    // The prompt and generated tokens stay cached.
    assert!(st.blocks_cached >= 2);
}

#[test]
fn cancel_then_resubmit_reuses_finished_chunks() {
    let model = MockModel::new(VOCAB, 128, 16, next).with_delay(Duration::from_millis(20));
    let e = engine(model, cfg());
    let p = prompt(8, 900);
    let h = e.submit(req(p.clone(), 4)).unwrap();
    // Cancel once the first chunk is computed (15 chunks of 64 at 20 ms each).
    let t = Instant::now();
    while e.stats().computed_prompt_tokens < 64 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    h.cancel();
    let (_, finish, _) = collect(h).unwrap();
    assert_eq!(finish, FinishReason::Cancelled);
    e.check_idle_accounting().unwrap();
    let computed = e.stats().computed_prompt_tokens as usize;
    assert!((64..900).contains(&computed), "{computed}");
    let (_, _, usage) = collect(e.submit(req(p, 4)).unwrap()).unwrap();
    assert_eq!(usage.cached_tokens, computed / 16 * 16);
    e.check_idle_accounting().unwrap();
}

#[test]
fn model_error_reaches_the_request_and_the_engine_keeps_running() {
    let model = MockModel::new(VOCAB, 64, 16, next).fail_on_token(499);
    let e = engine(model, cfg());
    let err = collect(e.submit(req(vec![5, 6, 499], 3)).unwrap()).unwrap_err();
    assert!(err.contains("mock failure"), "{err}");
    let (ids, _, _) = collect(e.submit(req(vec![5, 6, 7], 3)).unwrap()).unwrap();
    assert_eq!(ids.len(), 3);
    e.check_idle_accounting().unwrap();
    assert_eq!(e.stats().requests_failed, 1);
}

#[test]
fn queued_requests_wait_for_blocks_then_run() {
    // 8 blocks; each request needs 6: they run one after the other.
    let e = engine(MockModel::new(VOCAB, 8, 16, next), cfg());
    let hs: Vec<_> = (0..3)
        .map(|i| e.submit(req(prompt(20 + i, 80), 10)).unwrap())
        .collect();
    for h in hs {
        assert_eq!(collect(h).unwrap().1, FinishReason::Length);
    }
    e.check_idle_accounting().unwrap();
    assert_eq!(e.stats().max_step_seqs, 1);
}
