//! Speculative decoding over the mock: greedy output equals plain decoding token for token
//! with either kind of proposal, every step reads back exactly the kept tokens (rejected
//! positions leave no trace), the books balance after many rejections, and sampled output
//! keeps plain sampling's distribution.

use super::*;
use crate::config::{SpecConfig, SpecMode};

/// Mostly a cycle over ids 10..50 (a function of the last token alone, so lookup proposals
/// come true), broken at every eleventh position (so they also fail).
fn cyclic_next(pos: usize, last: u32) -> u32 {
    if pos.is_multiple_of(11) {
        10 + (last * 3 + pos as u32) % 40
    } else {
        10 + (last + 31) % 40
    }
}

/// A draft that agrees with [`cyclic_next`] except at every fifth position.
fn draft_next(pos: usize, last: u32) -> u32 {
    if pos.is_multiple_of(5) {
        10 + (last + 17) % 40
    } else {
        cyclic_next(pos, last)
    }
}

fn spec_cfg(mode: SpecMode, max_running: usize) -> EngineConfig {
    EngineConfig {
        spec: SpecConfig {
            mode,
            k: 6,
            max_batch: 4,
        },
        ..cfg(16, 64, 512, max_running)
    }
}

fn harness(mode: SpecMode, max_running: usize) -> Harness {
    let cfg = spec_cfg(mode, max_running);
    let model = MockModel::new(VOCAB, 256, 16, cyclic_next);
    match mode {
        SpecMode::Draft => {
            let draft = MockModel::new(VOCAB, 256, 16, draft_next);
            Harness::with_draft(cfg, model, draft)
        }
        _ => Harness::with_model(cfg, model),
    }
}

/// Runs `prompts` together (all submitted at once) and returns each one's tokens.
fn generate(h: &mut Harness, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    let mut clients: Vec<Client> = prompts
        .iter()
        .map(|p| h.submit(req(p.clone(), max_tokens)))
        .collect();
    h.run();
    clients
        .iter_mut()
        .map(|c| {
            assert_eq!(c.error(), None);
            c.tokens()
        })
        .collect()
}

/// Every step of the target read back, for positions before its start, exactly the tokens
/// the request kept (prompt + output).
fn assert_contexts_are_kept_tokens(h: &Harness, full: &[Vec<u32>]) {
    for r in h.steps().iter().flatten() {
        let seq = full
            .iter()
            .find(|f| f.starts_with(&r.context[..r.start.min(8)]))
            .expect("a known sequence");
        assert_eq!(
            r.context[..r.start],
            seq[..r.start],
            "a step at {} read a token that was not kept",
            r.start
        );
    }
}

fn prompts() -> Vec<Vec<u32>> {
    (0..3)
        .map(|i| prompt(100 + i, 40 + 13 * i as usize))
        .collect()
}

fn check_equals_plain(mode: SpecMode, max_running: usize) {
    let ps = prompts();
    let plain = generate(&mut harness(SpecMode::Off, max_running), &ps, 200);
    let mut h = harness(mode, max_running);
    let spec = generate(&mut h, &ps, 200);
    assert_eq!(spec, plain, "{mode:?} changed greedy output");
    let st = h.s.stats();
    assert!(st.spec_accepted > 150, "few proposals kept: {st:?}");
    assert!(
        st.spec_proposed > st.spec_accepted + 20,
        "few rejections: {st:?}"
    );
    assert!(
        st.forward_steps < plain.iter().map(Vec::len).sum::<usize>() as u64,
        "no steps saved: {st:?}"
    );
    let full: Vec<Vec<u32>> = ps
        .iter()
        .zip(&spec)
        .map(|(p, o)| [p.clone(), o.clone()].concat())
        .collect();
    assert_contexts_are_kept_tokens(&h, &full);
    h.finish();
}

#[test]
fn lookup_greedy_equals_plain_decoding() {
    check_equals_plain(SpecMode::Lookup, 1);
}

#[test]
fn draft_greedy_equals_plain_decoding() {
    check_equals_plain(SpecMode::Draft, 1);
}

#[test]
fn batched_sequences_speculate_and_still_equal_plain() {
    check_equals_plain(SpecMode::Lookup, 3);
    check_equals_plain(SpecMode::Draft, 2);
}

#[test]
fn speculation_pauses_while_many_sequences_decode() {
    let mut h = Harness::with_model(
        EngineConfig {
            spec: SpecConfig {
                mode: SpecMode::Lookup,
                k: 6,
                max_batch: 1,
            },
            ..cfg(16, 64, 512, 2)
        },
        MockModel::new(VOCAB, 256, 16, cyclic_next),
    );
    let ps: Vec<Vec<u32>> = (0..2).map(|i| prompt(40 + i, 30)).collect();
    generate(&mut h, &ps, 60);
    // Both decode together from their first tokens to the end: no step speculates.
    assert_eq!(h.s.stats().spec_steps, 0);
    h.finish();
}

#[test]
fn usage_counts_steps_and_proposals() {
    let mut h = harness(SpecMode::Lookup, 1);
    let mut c = h.submit(req(prompt(7, 30), 100));
    h.run();
    let u = c.done().expect("done").1;
    assert_eq!(u.completion_tokens, 100);
    assert!(u.decode_steps < 99, "{u:?}");
    assert!(
        u.spec_accepted > 0 && u.spec_proposed >= u.spec_accepted,
        "{u:?}"
    );
    // Every generated token after the first came from a step: one per step plus the kept
    // proposals.
    assert_eq!(u.decode_steps + u.spec_accepted, 99);
    h.finish();
}

#[test]
fn prefix_cache_after_speculation_holds_only_kept_tokens() {
    let mut h = harness(SpecMode::Lookup, 1);
    let p = prompt(9, 37);
    let mut c = h.submit(req(p.clone(), 90));
    h.run();
    let out = c.tokens();
    // The whole first exchange as the next prompt: it resumes from the cache.
    let p2 = [p.clone(), out.clone()].concat();
    let mut c2 = h.submit(req(p2.clone(), 20));
    h.run();
    let u = c2.done().expect("done").1;
    assert!(u.cached_tokens >= (p2.len() / 16 - 1) * 16, "{u:?}");
    let full = vec![[p2.clone(), c2.tokens()].concat()];
    assert_contexts_are_kept_tokens(&h, &full);
    h.finish();
}

#[test]
fn max_tokens_and_stop_hold_under_speculation() {
    for max in [1, 2, 5, 17] {
        let mut h = harness(SpecMode::Lookup, 1);
        let mut c = h.submit(req(prompt(3, 50), max));
        h.run();
        assert_eq!(
            c.done().expect("done"),
            (FinishReason::Length, c.done().unwrap().1)
        );
        assert_eq!(c.tokens().len(), max);
        h.finish();
    }
}

/// Sampling with speculation keeps the target's distribution: the histogram of the second and
/// third generated tokens over many seeds matches plain sampling's. Bound: total variation
/// below 0.06 with 3,000 runs each (two empirical histograms over ~10 tokens differ by
/// ~0.03 by chance).
#[test]
fn sampled_tokens_keep_plain_sampling_distribution() {
    const RUNS: u64 = 3000;
    let sampling = |seed| SamplingParams {
        temperature: 3.0,
        top_k: 6,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let histogram = |mode: SpecMode, at: usize| -> (Vec<f64>, EngineStats) {
        let mut h = harness(mode, 1);
        let mut counts = vec![0.0; VOCAB];
        let cycle: Vec<u32> = (10..50).collect();
        let p = [prompt(5, 21), cycle.clone(), cycle].concat();
        for seed in 0..RUNS {
            let mut c = h.submit(GenerateRequest {
                sampling: sampling(seed),
                ..req(p.clone(), 4)
            });
            h.run();
            counts[c.tokens()[at] as usize] += 1.0;
        }
        let st = h.s.stats();
        h.finish();
        (counts.iter().map(|c| c / RUNS as f64).collect(), st)
    };
    for at in [1, 2] {
        let (plain, _) = histogram(SpecMode::Off, at);
        let (spec, st) = histogram(SpecMode::Lookup, at);
        assert!(
            st.spec_proposed > RUNS && st.spec_accepted < st.spec_proposed,
            "{st:?}"
        );
        let tv: f64 = plain
            .iter()
            .zip(&spec)
            .map(|(a, b)| (a - b).abs())
            .sum::<f64>()
            / 2.0;
        assert!(tv < 0.06, "token {at}: total variation {tv}");
    }
}

use crate::stats::EngineStats;

/// A hybrid model (recurrent state, which the mock checks holds exactly the context before
/// every step): speculating sequences back their state up before each verify pass and run
/// their kept tokens again after a rejection, so greedy output stays plain decoding's, every
/// step finds its state in place, and the slots and blocks are back at idle afterwards.
#[test]
fn hybrid_state_is_restored_after_rejections() {
    let hybrid = |mode| {
        let model = MockModel::new(VOCAB, 256, 16, cyclic_next).with_state_slots(16);
        Harness::with_model(spec_cfg(mode, 2), model)
    };
    let ps = prompts();
    let plain = generate(&mut hybrid(SpecMode::Off), &ps, 200);
    let mut h = hybrid(SpecMode::Lookup);
    let spec = generate(&mut h, &ps, 200);
    assert_eq!(spec, plain, "lookup changed a hybrid model's greedy output");
    let st = h.s.stats();
    assert!(st.spec_accepted > 150, "few proposals kept: {st:?}");
    assert!(
        st.spec_proposed > st.spec_accepted + 20,
        "few rejections: {st:?}"
    );
    assert!(st.spec_redone_tokens > 0, "no state restored: {st:?}");
    assert!(
        st.forward_steps < plain.iter().map(Vec::len).sum::<usize>() as u64,
        "no steps saved: {st:?}"
    );
    h.finish();
}

/// A hybrid model whose state slots leave none spare beyond the running sequences' does not
/// speculate (no backup for its state) and still decodes plainly.
#[test]
fn hybrid_without_a_spare_slot_decodes_plainly() {
    let model = MockModel::new(VOCAB, 256, 16, cyclic_next).with_state_slots(2);
    let mut h = Harness::with_model(spec_cfg(SpecMode::Lookup, 2), model);
    let plain = {
        let model = MockModel::new(VOCAB, 256, 16, cyclic_next).with_state_slots(2);
        generate(
            &mut Harness::with_model(spec_cfg(SpecMode::Off, 2), model),
            &prompts(),
            60,
        )
    };
    assert_eq!(generate(&mut h, &prompts(), 60), plain);
    assert_eq!(h.s.stats().spec_proposed, 0);
    h.finish();
}
