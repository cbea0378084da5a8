//! The engine on a hybrid model (tiny-qwen3_5, gated DeltaNet + gated attention): its
//! recurrent state carried, snapshotted and resumed through the prefix cache gives the same
//! logits as running the prompt in one piece.
//!
//! The logits are those the model returned to the engine (a recording wrapper around
//! `PagedModel`), compared within the tolerance of the chunked vs recurrent delta rule.

use kestrel_engine::{Engine, EngineConfig, Event, GenerateRequest, SeqStep, StepModel, Usage};
use kestrel_models::{KvType, LoadOptions, Model, PagedModel};
use kestrel_sampler::SamplingParams;
use kestrel_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Chunked vs token-by-token delta rule, and chunks split at other places: the same
/// arithmetic up to the order of sums (kestrel-models' tiny_qwen35 tests measure 2.4e-5).
const TOLERANCE: f32 = 1e-4;

fn tiny_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny/tiny-qwen3_5")
}

/// The 300-token prompt of the transformers reference.
fn prompt_300() -> Vec<u32> {
    let bytes = std::fs::read(tiny_dir().join("reference.safetensors")).expect("reference");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("reference parses");
    let t = st.tensor("tokens_3").expect("tokens_3");
    let ids: Vec<u32> = t
        .data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32)
        .collect();
    assert_eq!(ids.len(), 300);
    ids
}

/// `PagedModel` that records the logits it returns and can hold its `forward_no`-th forward
/// call until released (to cancel a request at a known point).
struct Recording {
    inner: PagedModel,
    logits: Arc<Mutex<Vec<Vec<f32>>>>,
    calls: Arc<AtomicUsize>,
    hold_at: Option<(usize, Arc<AtomicBool>)>,
}

impl StepModel for Recording {
    fn vocab_size(&self) -> usize {
        StepModel::vocab_size(&self.inner)
    }
    fn kv_blocks(&self) -> usize {
        self.inner.kv_blocks()
    }
    fn block_size(&self) -> usize {
        StepModel::block_size(&self.inner)
    }
    fn forward(
        &mut self,
        seqs: &[SeqStep<'_>],
        out: &mut kestrel_engine::Logits,
    ) -> Result<(), String> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some((at, go)) = &self.hold_at {
            while n == *at && !go.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        self.inner.forward(seqs, out)?;
        let vocab = StepModel::vocab_size(&self.inner);
        let mut log = self.logits.lock().expect("log");
        log.extend(out.rows().chunks_exact(vocab).map(<[f32]>::to_vec));
        Ok(())
    }
    fn copy_block(&mut self, src: u32, dst: u32, n: usize) {
        StepModel::copy_block(&mut self.inner, src, dst, n)
    }
    fn state_slots(&self) -> usize {
        StepModel::state_slots(&self.inner)
    }
    fn copy_state(&mut self, src: u32, dst: u32) {
        StepModel::copy_state(&mut self.inner, src, dst)
    }
}

struct Setup {
    engine: Engine,
    logits: Arc<Mutex<Vec<Vec<f32>>>>,
    computed: Arc<AtomicU64>,
    calls: Arc<AtomicUsize>,
}

/// An engine over tiny-qwen3_5 with `chunk` prefill tokens per step.
fn start(
    chunk: usize,
    parallel: usize,
    snapshots: usize,
    hold: Option<(usize, Arc<AtomicBool>)>,
) -> Setup {
    let dir = tiny_dir();
    let tok = Arc::new(Tokenizer::from_hf_dir(&dir).expect("tokenizer"));
    let opts = LoadOptions {
        threads: 2,
        ..LoadOptions::default()
    };
    let model = Model::load(&dir, opts, &mut |_, _| {}).expect("model");
    let paged = PagedModel::new(model, 256, 16, KvType::F32).with_state_slots(parallel + snapshots);
    let computed = paged.tokens_computed.clone();
    let logits = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let rec = Recording {
        inner: paged,
        logits: logits.clone(),
        calls: calls.clone(),
        hold_at: hold,
    };
    let cfg = EngineConfig {
        block_size: 16,
        chunk_size: chunk,
        step_token_budget: chunk.max(parallel),
        max_running: parallel,
        ctx_size: 1024,
        spec: Default::default(),
    };
    let engine = Engine::try_start(Box::new(rec), tok, cfg).expect("engine starts");
    Setup {
        engine,
        logits,
        computed,
        calls,
    }
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

fn drain(h: &mut kestrel_engine::RequestHandle) -> (Vec<u32>, Usage) {
    let mut tokens = Vec::new();
    loop {
        match h.events.blocking_recv() {
            Some(Event::Token { id, .. }) => tokens.push(id),
            Some(Event::Done { usage, .. }) => return (tokens, usage),
            Some(Event::Error { message }) => panic!("request failed: {message}"),
            None => panic!("engine stopped"),
        }
    }
}

fn run(s: &Setup, prompt: Vec<u32>, max_tokens: usize) -> (Vec<u32>, Usage, Vec<Vec<f32>>) {
    let before = s.logits.lock().expect("log").len();
    let mut h = s.engine.submit(greedy(prompt, max_tokens)).expect("submit");
    let (tokens, usage) = drain(&mut h);
    let logits = s.logits.lock().expect("log")[before..].to_vec();
    (tokens, usage, logits)
}

fn max_abs(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "logit rows");
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// The 300-token prompt as 300 single-token steps, as one prefill, and as a prefill cancelled
/// midway then resumed through the cache: equal logits (last prompt position and 8 decodes).
#[test]
fn qwen35_prompt_three_ways_through_the_engine() {
    let p = prompt_300();
    let one = start(512, 1, 8, None);
    let (t_one, u_one, l_one) = run(&one, p.clone(), 8);
    assert_eq!(u_one.cached_tokens, 0);
    assert_eq!(
        one.calls.load(Ordering::SeqCst),
        1 + 7,
        "one prefill, then 7 decodes"
    );
    one.engine.check_idle_accounting().expect("idle accounting");

    let steps = start(1, 1, 8, None);
    let (t_steps, _, l_steps) = run(&steps, p.clone(), 8);
    assert_eq!(steps.calls.load(Ordering::SeqCst), 300 + 7);
    let err = max_abs(&l_one, &l_steps);
    eprintln!("300 single-token steps vs one prefill: max-abs logit difference {err:.2e}");
    assert!(err <= TOLERANCE, "single-token steps vs one prefill: {err}");
    assert_eq!(t_one, t_steps);
    steps
        .engine
        .check_idle_accounting()
        .expect("idle accounting");

    // chunks of 64; the third forward call waits until the request is cancelled
    let go = Arc::new(AtomicBool::new(false));
    let cut = start(64, 1, 8, Some((2, go.clone())));
    let h = cut.engine.submit(greedy(p.clone(), 8)).expect("submit");
    while cut.engine.stats().computed_prompt_tokens < 128 {
        std::thread::sleep(Duration::from_millis(2));
    }
    h.cancel();
    go.store(true, Ordering::SeqCst);
    cut.engine
        .check_idle_accounting()
        .expect("idle accounting after cancel");
    let ran_before = cut.computed.load(Ordering::SeqCst);
    assert!(
        (128..300).contains(&ran_before),
        "cancelled midway: {ran_before} ran"
    );
    let (t_cut, u_cut, l_cut) = run(&cut, p.clone(), 8);
    eprintln!(
        "cancelled after {ran_before} prompt tokens; resumed with {} cached",
        u_cut.cached_tokens
    );
    assert_eq!(
        u_cut.cached_tokens as u64, ran_before,
        "resumes where the cancel left it"
    );
    let ran = cut.computed.load(Ordering::SeqCst) - ran_before;
    assert_eq!(ran as usize, 300 - u_cut.cached_tokens + 7);
    let err = max_abs(&l_one, &l_cut);
    eprintln!("cancelled + resumed vs one prefill: max-abs logit difference {err:.2e}");
    assert!(err <= TOLERANCE, "resumed vs one prefill: {err}");
    assert_eq!(t_one, t_cut);
    cut.engine.check_idle_accounting().expect("idle accounting");
}

/// A second turn that extends the first (prompt + reply + new message) resumes from the
/// snapshot at the end of the first prompt and equals a cold run of the same prompt.
#[test]
fn qwen35_turn_two_resumes_turn_one_state() {
    let p = prompt_300();
    let warm = start(512, 1, 8, None);
    let turn1 = p[..137].to_vec(); // ends inside a block: a tail snapshot
    let (reply, u1, _) = run(&warm, turn1.clone(), 12);
    assert_eq!(u1.cached_tokens, 0);
    let mut turn2 = turn1.clone();
    turn2.extend(&reply);
    turn2.extend(&p[200..260]);
    let ran_before = warm.computed.load(Ordering::SeqCst);
    let (t_warm, u2, l_warm) = run(&warm, turn2.clone(), 10);
    let ran = warm.computed.load(Ordering::SeqCst) - ran_before;
    assert_eq!(
        u2.cached_tokens,
        turn1.len(),
        "turn 2 resumes at turn 1's prompt end"
    );
    assert_eq!(ran as usize, turn2.len() - turn1.len() + 9);
    warm.engine
        .check_idle_accounting()
        .expect("idle accounting");

    let cold = start(512, 1, 8, None);
    let (t_cold, u_cold, l_cold) = run(&cold, turn2, 10);
    assert_eq!(u_cold.cached_tokens, 0);
    let err = max_abs(&l_warm, &l_cold);
    eprintln!("turn 2 warm vs cold: max-abs logit difference {err:.2e}");
    assert!(err <= TOLERANCE, "warm vs cold: {err}");
    assert_eq!(t_warm, t_cold);
}

/// The same prompt asked again (a retry, a regenerated answer) resumes after its last token:
/// its first token comes from the logits kept with the end-of-prompt snapshot, nothing of the
/// prompt runs, and the answer equals the first one (and a cold run's, by the test above).
#[test]
fn qwen35_same_prompt_again_reuses_it_whole() {
    let p = prompt_300();
    for len in [137, 160] {
        // 137 ends inside a block (a tail snapshot), 160 on a block boundary
        let s = start(512, 1, 8, None);
        let (first, u1, l1) = run(&s, p[..len].to_vec(), 10);
        assert_eq!(u1.cached_tokens, 0);
        let ran_before = s.computed.load(Ordering::SeqCst);
        let (again, u2, l2) = run(&s, p[..len].to_vec(), 10);
        let ran = s.computed.load(Ordering::SeqCst) - ran_before;
        assert_eq!(u2.cached_tokens, len, "the whole prompt reused");
        assert_eq!(ran, 9, "only the 9 decode steps run");
        assert_eq!(again, first);
        // the decodes' logits (the prompt's last row is the first run's, not recomputed)
        assert_eq!(l2.len(), 9);
        let err = max_abs(&l1[1..], &l2);
        assert!(
            err <= TOLERANCE,
            "decodes after the reuse vs the first run: {err}"
        );
        s.engine.check_idle_accounting().expect("idle accounting");
    }
}

/// Several sequences at once, each with its own state slot, with a snapshot pool smaller than
/// what they would keep: each equals its run alone, and the books balance.
#[test]
fn qwen35_concurrent_sequences_equal_solo_runs() {
    let p = prompt_300();
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| p[i * 20..i * 20 + 60 + i * 17].to_vec())
        .collect();
    let solo: Vec<Vec<u32>> = {
        let s = start(512, 1, 2, None);
        prompts.iter().map(|q| run(&s, q.clone(), 6).0).collect()
    };
    let s = start(32, 3, 2, None);
    let mut handles: Vec<_> = prompts
        .iter()
        .map(|q| s.engine.submit(greedy(q.clone(), 6)).expect("submit"))
        .collect();
    for (h, want) in handles.iter_mut().zip(&solo) {
        assert_eq!(&drain(h).0, want);
    }
    s.engine.check_idle_accounting().expect("idle accounting");
    let st = s.engine.stats();
    assert_eq!(st.snapshots_total, 2);
    assert!(st.snapshots_used <= 2 && st.snapshots_evicted > 0, "{st:?}");
}
