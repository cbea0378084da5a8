//! The scheduler over a mock hybrid model (`MockModel::with_state_slots`): every step fails
//! unless its state slot holds exactly the context before it, so these tests check that the
//! state is carried, snapshotted and resumed at the right positions, and the books (blocks,
//! slots, snapshots) balance.

use super::*;
use crate::paged::SNAPSHOTS_PER_SEQUENCE;

/// A hybrid mock: `running` sequences, `snapshots` snapshot slots, `n_blocks` KV blocks. It
/// picks greedy rows itself (`with_device_argmax`: their floats poisoned), so a prompt's end,
/// whose logits the end-of-prompt snapshot keeps, must have asked for the whole row.
fn hybrid(chunk: usize, running: usize, snapshots: usize, n_blocks: usize) -> Harness {
    let model = MockModel::new(VOCAB, n_blocks, 16, default_next)
        .with_state_slots(running + snapshots)
        .with_device_argmax();
    Harness::with_model(cfg(16, chunk, 512.max(running), running), model)
}

fn usage(c: &mut Client) -> Usage {
    if let Some(e) = c.error() {
        panic!("request failed: {e}");
    }
    c.done().expect("request done").1
}

#[test]
fn hybrid_cancel_mid_prefill_resumes_from_the_last_chunk_snapshot() {
    let mut h = hybrid(64, 1, 8, 64);
    let p = prompt(7, 300);
    let c = h.submit(req(p.clone(), 4));
    h.s.step();
    h.s.step(); // chunks [0, 64) and [64, 128)
    c.cancel();
    h.run();
    let mut c = h.submit(req(p.clone(), 4));
    h.run();
    let u = usage(&mut c);
    assert_eq!(u.cached_tokens, 128);
    assert_eq!(h.s.stats().computed_prompt_tokens, 128 + (300 - 128));
    h.finish();
}

#[test]
fn hybrid_next_turn_resumes_at_the_end_of_the_last_prompt() {
    for generated in [5, 40] {
        let mut h = hybrid(64, 1, 8, 64);
        let p = prompt(3, 100); // ends inside block 6: a tail snapshot at 100
        let mut c = h.submit(req(p.clone(), generated));
        h.run();
        let mut turn2 = p.clone();
        turn2.extend(c.tokens());
        turn2.extend(prompt(4, 30));
        let mut c2 = h.submit(req(turn2.clone(), 3));
        h.run();
        let u = usage(&mut c2);
        assert_eq!(u.cached_tokens, 100, "after {generated} generated tokens");
        // a third turn extending the second resumes at its end (130 + generated)
        let mut turn3 = turn2.clone();
        turn3.extend(c2.tokens());
        turn3.push(9);
        let mut c3 = h.submit(req(turn3, 2));
        h.run();
        assert_eq!(usage(&mut c3).cached_tokens, turn2.len());
        h.finish();
    }
}

#[test]
fn hybrid_block_aligned_prompt_end_and_shared_prefix() {
    let mut h = hybrid(512, 2, 8, 64);
    let p = prompt(5, 96);
    let mut a = h.submit(req(p.clone(), 2));
    h.run();
    let first = a.tokens();
    assert_eq!(usage(&mut a).cached_tokens, 0);
    // another request sharing the 96 tokens, then departing
    let mut q = p.clone();
    q.extend(prompt(6, 20));
    let mut b = h.submit(req(q, 2));
    // the same prompt again: resumed after its last token, its first token from the logits
    // the snapshot kept (the mock fails any step whose state is not the context before it)
    let mut c = h.submit(req(p, 2));
    h.run();
    assert_eq!(usage(&mut b).cached_tokens, 96);
    assert_eq!(c.tokens(), first);
    assert_eq!(usage(&mut c).cached_tokens, 96);
    assert_eq!(h.s.stats().computed_prompt_tokens, 96 + 20);
    h.finish();
}

#[test]
fn hybrid_same_prompt_again_computes_nothing_and_answers_the_same() {
    // a prompt ending inside a block (a tail snapshot), and one token: the answer is the
    // kept logits' token alone
    for (len, max_tokens) in [(100, 6), (100, 1), (37, 3)] {
        let mut h = hybrid(64, 1, 8, 64);
        let p = prompt(9, len);
        let mut a = h.submit(req(p.clone(), max_tokens));
        h.run();
        let first = a.tokens();
        let computed = h.s.stats().computed_prompt_tokens;
        let mut c = h.submit(req(p.clone(), max_tokens));
        h.run();
        assert_eq!(c.tokens(), first, "len {len}, max_tokens {max_tokens}");
        let u = usage(&mut c);
        assert_eq!((u.cached_tokens, u.completion_tokens), (len, max_tokens));
        assert_eq!(h.s.stats().computed_prompt_tokens, computed);
        h.finish();
    }
}

#[test]
fn hybrid_snapshots_per_sequence_are_bounded() {
    let mut h = hybrid(32, 1, 64, 128);
    let p = prompt(11, 1000); // 31 chunk boundaries
    let mut c = h.submit(req(p.clone(), 2));
    h.run();
    usage(&mut c);
    let st = h.s.stats();
    assert_eq!(st.snapshots_used, SNAPSHOTS_PER_SEQUENCE);
    assert_eq!(st.snapshots_evicted, 0);
    // the latest chunk boundary (992) is kept: a prompt departing after it resumes there
    let mut q = p[..995].to_vec();
    q.push(1);
    let mut c = h.submit(req(q, 2));
    h.run();
    assert_eq!(usage(&mut c).cached_tokens, 992);
    h.finish();
}

#[test]
fn hybrid_snapshot_pool_bound_holds_under_many_sequences() {
    let snapshots = 5;
    let mut h = hybrid(32, 3, snapshots, 96);
    let check = |h: &Harness| {
        let st = h.s.stats();
        assert!(st.snapshots_used <= snapshots, "{st:?}");
        assert_eq!(st.snapshots_total, snapshots);
    };
    for round in 0..12u32 {
        // three prompts at once (up to SNAPSHOTS_PER_SEQUENCE snapshots each), the longest
        // finishing its prefill last
        let lens = [300, 90 + 7 * round as usize, 40 + 11 * round as usize];
        let mut cs: Vec<Client> = (0..3u32)
            .map(|k| h.submit(req(prompt(1000 + 3 * round + k, lens[k as usize]), 3)))
            .collect();
        while h.s.has_work() {
            h.s.step();
            check(&h);
        }
        let mut next = prompt(1000 + 3 * round, 300);
        next.extend(cs[0].tokens());
        next.push(5);
        for c in &mut cs {
            usage(c);
        }
        let mut c = h.submit(req(next, 2));
        while h.s.has_work() {
            h.s.step();
            check(&h);
        }
        assert_eq!(usage(&mut c).cached_tokens, 300, "round {round}");
        h.s.check_idle().expect("books balance");
    }
    let st = h.s.stats();
    assert!(st.snapshots_evicted > 0, "the pool was never full: {st:?}");
    h.finish();
}

#[test]
fn hybrid_evicting_blocks_frees_their_snapshots() {
    // 20 blocks: each 150-token request needs 10, so the second evicts the first's blocks.
    let mut h = hybrid(64, 1, 8, 20);
    for seed in [1, 2, 3, 1] {
        let mut c = h.submit(req(prompt(seed, 150), 4));
        h.run();
        usage(&mut c);
        h.s.check_idle().expect("books balance after eviction");
    }
    h.finish();
}
