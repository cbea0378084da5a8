//! Deterministic scheduler tests: the scheduler is stepped by hand over the mock model, so
//! every step's composition is known. Every test ends with the leak check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use kestrel_sampler::{Sampler, SamplingParams};
use kestrel_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::config::EngineConfig;
use crate::mock::{MockLog, MockModel, RecordedSeq};
use crate::request::{Event, FinishReason, GenerateRequest, Usage};
use crate::scheduler::Scheduler;
use crate::sequence::Pending;

const VOCAB: usize = 512;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-tokenizer");
        Tokenizer::from_hf_dir(dir).expect("test tokenizer")
    })
}

/// Default next-token rule: never a special token (ids 0..3).
fn default_next(pos: usize, last: u32) -> u32 {
    10 + ((pos as u32).wrapping_mul(7).wrapping_add(last)) % 480
}

struct Client {
    rx: UnboundedReceiver<Event>,
    cancel: Arc<AtomicBool>,
    seen: Vec<Event>,
}

impl Client {
    fn drain(&mut self) -> &[Event] {
        while let Ok(ev) = self.rx.try_recv() {
            self.seen.push(ev);
        }
        &self.seen
    }
    fn done(&mut self) -> Option<(FinishReason, Usage)> {
        self.drain().iter().find_map(|e| match e {
            Event::Done { finish, usage } => Some((*finish, *usage)),
            _ => None,
        })
    }
    fn error(&mut self) -> Option<String> {
        self.drain().iter().find_map(|e| match e {
            Event::Error { message } => Some(message.clone()),
            _ => None,
        })
    }
    fn tokens(&mut self) -> Vec<u32> {
        self.drain()
            .iter()
            .filter_map(|e| match e {
                Event::Token { id, .. } => Some(*id),
                _ => None,
            })
            .collect()
    }
    fn text(&mut self) -> String {
        self.drain()
            .iter()
            .filter_map(|e| match e {
                Event::Token { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
    fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }
}

struct Harness {
    s: Scheduler<'static>,
    log: Arc<Mutex<MockLog>>,
}

fn cfg(block_size: usize, chunk: usize, budget: usize, max_running: usize) -> EngineConfig {
    EngineConfig {
        block_size,
        chunk_size: chunk,
        step_token_budget: budget,
        max_running,
        ctx_size: 1 << 20,
        spec: Default::default(),
    }
}

impl Harness {
    fn new(cfg: EngineConfig, n_blocks: usize) -> Self {
        Self::with_model(
            cfg.clone(),
            MockModel::new(VOCAB, n_blocks, cfg.block_size, default_next),
        )
    }
    fn with_model(cfg: EngineConfig, model: MockModel) -> Self {
        let log = model.log();
        Self {
            s: Scheduler::new(Box::new(model), None, tokenizer(), cfg),
            log,
        }
    }
    /// With a draft model for speculative decoding (`cfg.spec.mode` should be `Draft`).
    fn with_draft(cfg: EngineConfig, model: MockModel, draft: MockModel) -> Self {
        let log = model.log();
        Self {
            s: Scheduler::new(Box::new(model), Some(Box::new(draft)), tokenizer(), cfg),
            log,
        }
    }
    fn submit(&mut self, req: GenerateRequest) -> Client {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let sampler = Sampler::new(req.sampling.clone(), VOCAB).expect("sampler");
        self.s.enqueue(Pending {
            req,
            sampler,
            tx,
            cancel: Arc::clone(&cancel),
            submitted: Instant::now(),
        });
        Client {
            rx,
            cancel,
            seen: Vec::new(),
        }
    }
    fn run(&mut self) {
        for _ in 0..100_000 {
            if !self.s.has_work() {
                return;
            }
            self.s.step();
        }
        panic!("scheduler did not finish");
    }
    fn steps(&self) -> Vec<Vec<RecordedSeq>> {
        self.log.lock().unwrap().steps.clone()
    }
    fn n_steps(&self) -> usize {
        self.log.lock().unwrap().steps.len()
    }
    /// Leak check: run to idle, then every block free or cached.
    fn finish(mut self) {
        self.run();
        self.s.check_idle().expect("idle accounting");
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

/// `n` prompt tokens from a seed (ids 3..=402: no specials).
fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| {
            3 + (i
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(40503))
                >> 7)
                % 400
        })
        .collect()
}

/// Prefill chunk lengths the mock saw for sequences whose context starts with `prefix`.
fn prefill_chunks(steps: &[Vec<RecordedSeq>], prompt_len: usize, first: &[u32]) -> Vec<usize> {
    steps
        .iter()
        .flatten()
        .filter(|r| r.context.starts_with(first) && r.start < prompt_len)
        .map(|r| r.tokens.len())
        .collect()
}

#[test]
fn chunked_prefill_1300_runs_as_512_512_276() {
    let mut h = Harness::new(cfg(16, 512, 512, 4), 200);
    let p = prompt(1, 1300);
    let mut c = h.submit(req(p.clone(), 3));
    h.run();
    let steps = h.steps();
    assert_eq!(prefill_chunks(&steps, 1300, &p[..16]), vec![512, 512, 276]);
    let wants: Vec<bool> = steps.iter().take(3).map(|s| s[0].want_logits).collect();
    assert_eq!(wants, vec![false, false, true]);
    // The context the model saw at the last chunk is the whole prompt, read back from KV.
    assert_eq!(steps[2][0].context, p);
    let (finish, usage) = c.done().unwrap();
    assert_eq!(finish, FinishReason::Length);
    assert_eq!(
        (
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens
        ),
        (1300, 0, 3)
    );
    assert_eq!(h.s.stats().computed_prompt_tokens, 1300);
    h.finish();
}

#[test]
fn long_prefill_interleaves_with_decodes() {
    let mut h = Harness::new(cfg(16, 512, 512, 4), 200);
    let short = prompt(2, 10);
    let long = prompt(3, 1300);
    let mut a = h.submit(req(short.clone(), 40));
    h.s.step(); // A prefill + first token
    let mut b = h.submit(req(long.clone(), 2));
    h.run();
    let steps = h.steps();
    // Every step where B prefills also carries A's decode.
    let mut b_chunks = 0;
    for s in &steps[1..] {
        let b_pref = s
            .iter()
            .find(|r| r.context.starts_with(&long[..16]) && r.start < 1300);
        if let Some(r) = b_pref {
            b_chunks += 1;
            let a_dec = s
                .iter()
                .any(|r| r.context.starts_with(&short) && r.tokens.len() == 1);
            assert!(a_dec, "a step with B's prefill lacks A's decode");
            assert!(s.iter().map(|r| r.tokens.len()).sum::<usize>() <= 512);
            if !r.want_logits {
                assert_eq!(
                    (r.start + r.tokens.len()) % 16,
                    0,
                    "mid-prompt chunk not block aligned"
                );
            }
        }
    }
    assert!(b_chunks >= 3);
    assert_eq!(a.tokens().len(), 40);
    assert_eq!(b.done().unwrap().0, FinishReason::Length);
    h.finish();
}

#[test]
fn prefix_hit_computes_only_the_rest() {
    let mut h = Harness::new(cfg(16, 512, 512, 4), 64);
    let p = prompt(4, 100);
    let mut a = h.submit(req(p.clone(), 3));
    h.run();
    assert_eq!(a.done().unwrap().1.cached_tokens, 0);
    let before = h.s.stats().computed_prompt_tokens;
    let mut q = p[..96].to_vec();
    q.extend(prompt(5, 34));
    let mut b = h.submit(req(q.clone(), 3));
    let first_b_step = h.n_steps();
    h.run();
    let usage = b.done().unwrap().1;
    assert_eq!(usage.cached_tokens, 96);
    assert_eq!(h.s.stats().computed_prompt_tokens - before, 34);
    assert_eq!(h.s.stats().cached_prompt_tokens, 96);
    let r = &h.steps()[first_b_step][0];
    assert_eq!((r.start, r.tokens.len()), (96, 34));
    assert_eq!(r.context, q, "cached blocks hold the shared prefix");
    h.finish();
}

#[test]
fn fully_cached_prompt_copies_last_block_and_runs_one_token() {
    let mut h = Harness::new(cfg(16, 512, 512, 4), 64);
    let p = prompt(6, 64);
    let mut a = h.submit(req(p.clone(), 5));
    h.run();
    let n = h.n_steps();
    let mut b = h.submit(req(p.clone(), 5));
    h.run();
    assert_eq!(b.done().unwrap().1.cached_tokens, 63);
    let r = &h.steps()[n][0];
    assert_eq!((r.start, r.tokens.len()), (63, 1));
    assert_eq!(r.context, p);
    let copies = h.log.lock().unwrap().copies.clone();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].2, 15);
    assert_eq!(a.tokens(), b.tokens(), "same prompt, same greedy output");
    h.finish();
}

#[test]
fn longest_prefix_wins_over_all_cached_sequences() {
    let mut h = Harness::new(cfg(16, 512, 512, 1), 128);
    let p = prompt(7, 32);
    let x = [p.clone(), prompt(8, 32)].concat(); // P + Q (4 blocks)
    let y = [p.clone(), prompt(9, 48)].concat(); // P + R (5 blocks)
    let z = [p[..16].to_vec(), prompt(10, 16)].concat(); // shares 1 block
    for s in [&x, &y, &z] {
        let mut c = h.submit(req(s.clone(), 1));
        h.run();
        c.done().unwrap();
    }
    let mut c = h.submit(req([y.clone(), prompt(11, 20)].concat(), 1));
    h.run();
    assert_eq!(c.done().unwrap().1.cached_tokens, 80);
    let mut c = h.submit(req([x.clone(), prompt(12, 5)].concat(), 1));
    h.run();
    assert_eq!(c.done().unwrap().1.cached_tokens, 64);
    let mut c = h.submit(req([p.clone(), prompt(13, 40)].concat(), 1));
    h.run();
    assert_eq!(c.done().unwrap().1.cached_tokens, 32);
    h.finish();
}

#[test]
fn lru_eviction_only_under_pressure_oldest_first() {
    let mut h = Harness::new(cfg(16, 512, 512, 1), 8);
    let a = prompt(20, 48);
    let b = prompt(21, 48);
    for p in [&a, &b] {
        let mut c = h.submit(req(p.clone(), 16)); // 4 blocks each, 3 full cached
        h.run();
        c.done().unwrap();
    }
    let st = h.s.stats();
    assert_eq!(
        (st.blocks_cached, st.blocks_free, st.blocks_used),
        (6, 2, 0)
    );
    // C needs 5 blocks: the 2 free ones and the 3 least recently used (all of A's).
    let mut c = h.submit(req(prompt(22, 64), 16));
    h.run();
    assert_eq!(c.done().unwrap().1.cached_tokens, 0);
    let mut cb = h.submit(req(b.clone(), 4));
    h.run();
    assert_eq!(
        cb.done().unwrap().1.cached_tokens,
        47,
        "B survived eviction"
    );
    let mut ca = h.submit(req(a.clone(), 4));
    h.run();
    assert_eq!(ca.done().unwrap().1.cached_tokens, 0, "A was evicted first");
    h.finish();
}

#[test]
fn queueing_when_pool_is_full_and_fifo_order() {
    let mut h = Harness::new(cfg(16, 512, 512, 4), 8);
    let mut a = h.submit(req(prompt(30, 90), 10)); // 100 positions: 7 blocks
    let mut b = h.submit(req(prompt(31, 30), 10)); // 40 positions: 3 blocks
    h.s.step();
    let st = h.s.stats();
    assert_eq!((st.running, st.queue_depth), (1, 1));
    assert_eq!(st.blocks_used + st.blocks_reserved, 7);
    h.run();
    assert_eq!(a.done().unwrap().0, FinishReason::Length);
    assert_eq!(b.done().unwrap().0, FinishReason::Length);
    // B never shared a step with A.
    assert!(h.steps().iter().all(|s| s.len() == 1));
    h.finish();
}

#[test]
fn max_running_limits_admission() {
    let mut h = Harness::new(cfg(16, 512, 512, 2), 64);
    let mut cs: Vec<Client> = (0..3)
        .map(|i| h.submit(req(prompt(40 + i, 8), 5)))
        .collect();
    h.s.step();
    assert_eq!((h.s.stats().running, h.s.stats().queue_depth), (2, 1));
    h.run();
    for c in &mut cs {
        assert_eq!(c.done().unwrap().1.completion_tokens, 5);
    }
    assert_eq!(h.s.stats().max_step_seqs, 2);
    h.finish();
}

#[test]
fn cancel_while_queued() {
    let mut h = Harness::new(cfg(16, 512, 512, 1), 64);
    let mut a = h.submit(req(prompt(50, 20), 10));
    let bp = prompt(51, 20);
    let mut b = h.submit(req(bp.clone(), 10));
    h.s.step();
    b.cancel();
    h.s.step();
    let (finish, usage) = b.done().unwrap();
    assert_eq!(
        (finish, usage.completion_tokens),
        (FinishReason::Cancelled, 0)
    );
    h.run();
    assert_eq!(a.done().unwrap().0, FinishReason::Length);
    assert!(h
        .steps()
        .iter()
        .flatten()
        .all(|r| !r.context.starts_with(&bp)));
    assert_eq!(h.s.stats().requests_cancelled, 1);
    h.finish();
}

#[test]
fn cancel_mid_prefill_keeps_finished_chunks() {
    let mut h = Harness::new(cfg(16, 512, 512, 4), 200);
    let p = prompt(60, 1300);
    let mut a = h.submit(req(p.clone(), 5));
    h.s.step(); // chunk 1: 512 tokens
    a.cancel();
    h.s.step(); // cancelled before any more work
    assert_eq!(h.n_steps(), 1, "cancelled work stops within one step");
    assert_eq!(a.done().unwrap().0, FinishReason::Cancelled);
    assert_eq!(h.s.stats().blocks_cached, 32);
    h.s.check_idle().unwrap();
    let before = h.s.stats().computed_prompt_tokens;
    let mut b = h.submit(req(p.clone(), 5));
    h.run();
    assert_eq!(b.done().unwrap().1.cached_tokens, 512);
    assert_eq!(h.s.stats().computed_prompt_tokens - before, 788);
    h.finish();
}

#[test]
fn cancel_mid_decode_keeps_prompt_and_generated_tokens() {
    let mut h = Harness::new(cfg(16, 512, 512, 4), 64);
    let p = prompt(70, 40);
    let mut a = h.submit(req(p.clone(), 100));
    for _ in 0..20 {
        h.s.step(); // prefill + 19 decodes: 20 tokens sampled, 59 positions computed
    }
    a.cancel();
    h.s.step();
    assert_eq!(h.n_steps(), 20);
    let (finish, usage) = a.done().unwrap();
    assert_eq!(
        (finish, usage.completion_tokens),
        (FinishReason::Cancelled, 20)
    );
    let generated = a.tokens();
    let mut b = h.submit(req([p.clone(), generated].concat(), 3));
    h.run();
    assert_eq!(
        b.done().unwrap().1.cached_tokens,
        48,
        "prompt + generated full blocks cached"
    );
    h.finish();
}

#[test]
fn closed_receiver_counts_as_cancel() {
    let mut h = Harness::new(cfg(16, 512, 512, 4), 64);
    let a = h.submit(req(prompt(80, 20), 50));
    h.s.step();
    h.s.step();
    drop(a);
    h.s.step();
    assert_eq!(h.n_steps(), 2);
    assert_eq!(h.s.stats().requests_cancelled, 1);
    h.finish();
}

#[test]
fn batching_decodes_several_sequences_per_step_and_matches_solo_runs() {
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| prompt(90 + i, 20 + 7 * i as usize))
        .collect();
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut h = Harness::new(cfg(16, 512, 512, 4), 64);
            let mut c = h.submit(req(p.clone(), 12));
            h.run();
            c.tokens()
        })
        .collect();
    let mut h = Harness::new(cfg(16, 512, 512, 4), 64);
    let mut cs: Vec<Client> = prompts
        .iter()
        .map(|p| h.submit(req(p.clone(), 12)))
        .collect();
    h.run();
    for (c, s) in cs.iter_mut().zip(&solo) {
        assert_eq!(&c.tokens(), s);
    }
    let st = h.s.stats();
    assert_eq!(st.max_step_decodes, 4);
    assert!(h.n_steps() <= 13, "{} steps for 4 x 12 tokens", h.n_steps());
    h.finish();
}

#[test]
fn sampling_many_sequences_at_once_draws_what_each_would_alone() {
    // 8 sequences decode together, so their tokens are drawn on several threads; each keeps
    // its own seeded sampler, so every one draws what it draws alone. Temperature 8 flattens
    // the mock's logits (the planted token 10, the rest 0-1.2): the draws are really random.
    let sampled = |i: u32, p: &[u32]| GenerateRequest {
        sampling: SamplingParams {
            temperature: 8.0,
            repeat_penalty: 1.1,
            repeat_last_n: 16,
            seed: Some(1000 + i as u64),
            ..SamplingParams::greedy()
        },
        ..req(p.to_vec(), 10)
    };
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|i| prompt(200 + i, 9 + 3 * i as usize))
        .collect();
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut h = Harness::new(cfg(16, 512, 512, 8), 64);
            let mut c = h.submit(sampled(i as u32, p));
            h.run();
            c.tokens()
        })
        .collect();
    let mut h = Harness::new(cfg(16, 512, 512, 8), 64);
    let mut cs: Vec<Client> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| h.submit(sampled(i as u32, p)))
        .collect();
    h.run();
    for (c, s) in cs.iter_mut().zip(&solo) {
        assert_eq!(&c.tokens(), s);
    }
    assert_eq!(h.s.stats().max_step_decodes, 8);
    // not the planted token every time: the temperature made them random draws
    let planted = solo.iter().flatten().count();
    let distinct: std::collections::HashSet<_> = solo.iter().flatten().collect();
    assert!(
        distinct.len() > planted / 4,
        "{} distinct of {planted}",
        distinct.len()
    );
    h.finish();
}

#[test]
fn eog_stops_unless_ignored() {
    // The model wants eog (id 0) as the 4th generated token.
    let p = prompt(100, 10);
    let next = move |pos: usize, last: u32| {
        if pos == 12 {
            0
        } else {
            default_next(pos, last)
        }
    };
    for ignore in [false, true] {
        let model = MockModel::new(VOCAB, 64, 16, next);
        let mut h = Harness::with_model(cfg(16, 512, 512, 4), model);
        let mut r = req(p.clone(), 8);
        r.ignore_eos = ignore;
        let mut c = h.submit(r);
        h.run();
        let (finish, usage) = c.done().unwrap();
        if ignore {
            assert_eq!((finish, usage.completion_tokens), (FinishReason::Length, 8));
        } else {
            assert_eq!((finish, usage.completion_tokens), (FinishReason::Stop, 4));
            assert_eq!(c.tokens().last(), Some(&0));
        }
        h.finish();
    }
}

#[test]
fn stop_string_cuts_text_and_stops() {
    let p = prompt(110, 10);
    // Full text of 12 greedy tokens without stop strings.
    let mut h = Harness::new(cfg(16, 512, 512, 4), 64);
    let mut c = h.submit(req(p.clone(), 12));
    h.run();
    let ids = c.tokens();
    let full = tokenizer().decode(&ids, true);
    assert_eq!(c.text(), full);
    h.finish();
    // Stop on the text of tokens 5..7 (as a string it may start earlier; find it).
    let stop = tokenizer().decode(&ids[5..7], true);
    assert!(!stop.is_empty());
    let at = full.find(&stop).unwrap();
    let mut h = Harness::new(cfg(16, 512, 512, 4), 64);
    let mut r = req(p.clone(), 12);
    r.stop = vec![stop.clone()];
    let mut c = h.submit(r);
    h.run();
    assert_eq!(c.done().unwrap().0, FinishReason::Stop);
    assert_eq!(c.text(), full[..at]);
    assert!(c.tokens().len() <= 7);
    h.finish();
}

#[test]
fn max_tokens_gives_length_and_exact_count() {
    let mut h = Harness::new(cfg(16, 512, 512, 4), 64);
    let mut c = h.submit(req(prompt(120, 5), 1));
    h.run();
    let (finish, usage) = c.done().unwrap();
    assert_eq!((finish, usage.completion_tokens), (FinishReason::Length, 1));
    assert_eq!(c.tokens().len(), 1);
    h.finish();
}

#[test]
fn logprobs_report_chosen_and_top() {
    let mut h = Harness::new(cfg(16, 512, 512, 4), 64);
    let mut r = req(prompt(130, 5), 3);
    r.logprobs = Some(4);
    let mut c = h.submit(r);
    h.run();
    let lps: Vec<_> = c
        .drain()
        .iter()
        .filter_map(|e| match e {
            Event::Token { id, logprob, .. } => Some((*id, logprob.clone().unwrap())),
            _ => None,
        })
        .collect();
    assert_eq!(lps.len(), 3);
    for (id, lp) in lps {
        assert_eq!(lp.id, id);
        assert_eq!(lp.top.len(), 4);
        assert_eq!(lp.top[0].0, id, "greedy picks the top token");
        assert!((lp.top[0].1 - lp.logprob).abs() < 1e-5);
        assert!(lp.logprob < 0.0 && lp.logprob > -0.1);
    }
    h.finish();
}

#[test]
fn greedy_rows_take_the_models_own_argmax_and_the_others_read_their_logits() {
    // A model that picks greedy rows itself and poisons their floats: plain greedy requests
    // must take its picks (and ask for nothing else), while log-probabilities, penalties and
    // temperature must read whole rows — all giving what the plain model gives.
    let kinds = |i: u32, p: &[u32]| {
        let mut r = req(p.to_vec(), 6);
        match i % 4 {
            0 => {}
            1 => r.logprobs = Some(2),
            2 => r.sampling.repeat_penalty = 1.3,
            _ => {
                r.sampling.temperature = 4.0;
                r.sampling.top_k = 0;
                r.sampling.seed = Some(7);
            }
        }
        r
    };
    let prompts: Vec<Vec<u32>> = (0..8).map(|i| prompt(300 + i, 5 + i as usize)).collect();
    let run = |model: MockModel| {
        let mut h = Harness::with_model(cfg(16, 512, 512, 8), model);
        let mut cs: Vec<Client> = (0..8u32)
            .map(|i| h.submit(kinds(i, &prompts[i as usize])))
            .collect();
        h.run();
        // the tokens' events (ids, texts, log-probabilities); Done carries timings
        let out: Vec<Vec<Event>> = cs
            .iter_mut()
            .map(|c| {
                c.drain()
                    .iter()
                    .filter(|e| matches!(e, Event::Token { .. }))
                    .cloned()
                    .collect()
            })
            .collect();
        (out, h)
    };
    let (plain, _) = run(MockModel::new(VOCAB, 64, 16, default_next));
    let (picked, h) = run(MockModel::new(VOCAB, 64, 16, default_next).with_device_argmax());
    assert_eq!(plain.iter().map(Vec::len).sum::<usize>(), 8 * 6);
    assert_eq!(format!("{plain:?}"), format!("{picked:?}"));
    let steps = h.steps();
    // which sequence a recorded row is: its prompt
    let asked: Vec<(usize, bool)> = steps
        .iter()
        .flatten()
        .filter(|r| r.want_logits)
        .map(|r| {
            let i = prompts
                .iter()
                .position(|p| r.context.starts_with(p))
                .unwrap();
            (i, r.argmax_only)
        })
        .collect();
    assert!(asked.iter().any(|&(i, a)| i % 4 == 0 && a));
    for (i, a) in asked {
        assert_eq!(a, i % 4 == 0, "sequence {i}");
    }
    h.finish();
}

#[test]
fn model_error_fails_only_its_step_and_engine_continues() {
    let bad = prompt(140, 20);
    let poison = 499; // not produced by prompt() nor default_next
    let model = MockModel::new(VOCAB, 64, 16, default_next).fail_on_token(poison);
    let mut h = Harness::with_model(cfg(16, 512, 512, 1), model);
    let mut a = h.submit(req([bad.clone(), vec![poison]].concat(), 5));
    let mut b = h.submit(req(prompt(141, 20), 5));
    h.run();
    assert!(a.error().unwrap().contains("mock failure"));
    assert_eq!(b.done().unwrap().0, FinishReason::Length);
    assert_eq!(h.s.stats().requests_failed, 1);
    h.finish();
}

/// Hybrid models (recurrent state and its snapshots) over the mock playing one.
mod speculative;
mod state;
