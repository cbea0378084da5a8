//! Each processor on its own, on hand-built logits.

use kestrel_sampler::processors::{dist, greedy, MinP, Penalties, Temperature, TopK, TopP};
use kestrel_sampler::{Candidates, Xoshiro256StarStar};

fn ln_probs(p: &[f64]) -> Vec<f32> {
    p.iter().map(|&x| x.ln() as f32).collect()
}

fn sorted_ids(c: &Candidates) -> Vec<u32> {
    let mut v: Vec<u32> = c.ids().collect();
    v.sort_unstable();
    v
}

fn logit(c: &Candidates, id: u32) -> f32 {
    c.get(id).expect("candidate present").logit
}

fn assert_close(a: f32, b: f32) {
    assert!((a - b).abs() < 1e-5, "{a} != {b}");
}

// ---- penalties ----

fn penalties(repeat: f32, last_n: i32, presence: f32, frequency: f32) -> Penalties {
    Penalties {
        repeat,
        last_n,
        presence,
        frequency,
    }
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative() {
    let mut c = Candidates::from_logits(&[3.0, -2.0, 1.0, 0.5]);
    let mut scratch = Vec::new();
    penalties(2.0, 64, 0.0, 0.0).apply(&mut c, &[0, 1, 1], &mut scratch);
    assert_close(logit(&c, 0), 1.5); // 3 / 2
    assert_close(logit(&c, 1), -4.0); // -2 * 2, once even though seen twice
    assert_close(logit(&c, 2), 1.0); // not in history
    assert_close(logit(&c, 3), 0.5);
}

#[test]
fn presence_and_frequency_penalties_follow_openai() {
    let mut c = Candidates::from_logits(&[1.0, 1.0, 1.0]);
    let mut scratch = Vec::new();
    // token 0 three times, token 1 once.
    penalties(1.0, 64, 0.5, 0.25).apply(&mut c, &[0, 1, 0, 0], &mut scratch);
    assert_close(logit(&c, 0), 1.0 - (3.0 * 0.25 + 0.5));
    assert_close(logit(&c, 1), 1.0 - (0.25 + 0.5));
    assert_close(logit(&c, 2), 1.0);
}

#[test]
fn repeat_then_openai_penalties_combine() {
    let mut c = Candidates::from_logits(&[4.0, -1.0]);
    let mut scratch = Vec::new();
    penalties(2.0, 64, 1.0, 0.5).apply(&mut c, &[0, 0, 1], &mut scratch);
    assert_close(logit(&c, 0), 4.0 / 2.0 - (2.0 * 0.5 + 1.0));
    assert_close(logit(&c, 1), -2.0 - (0.5 + 1.0)); // -1 * 2
}

#[test]
fn penalties_only_look_at_the_last_n_tokens() {
    let mut c = Candidates::from_logits(&[2.0, 2.0, 2.0]);
    let mut scratch = Vec::new();
    // Window of 2 is [1, 2]; token 0 is older and not penalized.
    penalties(1.0, 2, 1.0, 0.0).apply(&mut c, &[0, 0, 1, 2], &mut scratch);
    assert_close(logit(&c, 0), 2.0);
    assert_close(logit(&c, 1), 1.0);
    assert_close(logit(&c, 2), 1.0);

    // -1: whole history; 0: disabled.
    let mut c = Candidates::from_logits(&[2.0, 2.0]);
    penalties(1.0, -1, 0.0, 1.0).apply(&mut c, &[0, 0, 0, 1], &mut scratch);
    assert_close(logit(&c, 0), -1.0);
    assert_close(logit(&c, 1), 1.0);
    let mut c = Candidates::from_logits(&[2.0, 2.0]);
    penalties(2.0, 0, 1.0, 1.0).apply(&mut c, &[0, 1], &mut scratch);
    assert_close(logit(&c, 0), 2.0);
}

#[test]
fn penalties_ignore_out_of_vocab_history() {
    let mut c = Candidates::from_logits(&[1.0, 1.0]);
    let mut scratch = Vec::new();
    penalties(2.0, 64, 1.0, 1.0).apply(&mut c, &[7, u32::MAX], &mut scratch);
    assert_close(logit(&c, 0), 1.0);
    assert_close(logit(&c, 1), 1.0);
}

// ---- top-k ----

#[test]
fn top_k_cuts_to_k_highest() {
    let mut c = Candidates::from_logits(&[0.1, 5.0, -1.0, 3.0, 4.0, 2.0]);
    TopK(3).apply(&mut c);
    assert_eq!(c.ids().collect::<Vec<_>>(), vec![1, 4, 3]); // sorted, best first
    let mut c = Candidates::from_logits(&[0.1, 5.0]);
    TopK(0).apply(&mut c);
    assert_eq!(c.len(), 2);
    TopK(10).apply(&mut c);
    assert_eq!(c.len(), 2);
}

#[test]
fn top_k_on_large_vocab_matches_full_sort() {
    let n = 150_000u32;
    let logits: Vec<f32> = (0..n)
        .map(|i| ((i.wrapping_mul(2_654_435_761)) % 100_003) as f32 / 1000.0)
        .collect();
    let mut c = Candidates::from_logits(&logits);
    TopK(40).apply(&mut c);
    let mut all: Vec<(u32, f32)> = logits
        .iter()
        .copied()
        .enumerate()
        .map(|(i, l)| (i as u32, l))
        .collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let want: Vec<u32> = all[..40].iter().map(|x| x.0).collect();
    assert_eq!(c.ids().collect::<Vec<_>>(), want);
}

#[test]
fn top_k_ties_go_to_lowest_id() {
    let mut c = Candidates::from_logits(&[1.0, 2.0, 2.0, 2.0]);
    TopK(2).apply(&mut c);
    assert_eq!(c.ids().collect::<Vec<_>>(), vec![1, 2]);
}

// ---- top-p ----

#[test]
fn top_p_keeps_smallest_set_reaching_p() {
    // Probabilities 0.5, 0.3, 0.15, 0.05 at ids 2, 0, 3, 1.
    let logits = ln_probs(&[0.3, 0.05, 0.5, 0.15]);
    let run = |p: f32| {
        let mut c = Candidates::from_logits(&logits);
        TopP(p).apply(&mut c);
        c.ids().collect::<Vec<_>>()
    };
    assert_eq!(run(0.4), vec![2]); // 0.5 >= 0.4
    assert_eq!(run(0.5), vec![2]); // exactly reached by the top token
    assert_eq!(run(0.75), vec![2, 0]); // 0.8
    assert_eq!(run(0.9), vec![2, 0, 3]); // 0.95
    assert_eq!(run(0.99), vec![2, 0, 3, 1]);
    assert_eq!(run(1.0).len(), 4); // disabled
}

#[test]
fn top_p_on_large_flat_vocab_grows_prefix() {
    // 10_000 equal tokens: p = 0.5 needs 5_000 of them, beyond the first
    // partial-sort window, and ties go to the lowest ids.
    let logits = vec![0.0f32; 10_000];
    let mut c = Candidates::from_logits(&logits);
    TopP(0.5).apply(&mut c);
    assert_eq!(c.len(), 5_000);
    assert_eq!(sorted_ids(&c), (0..5_000).collect::<Vec<u32>>());
}

// ---- min-p ----

#[test]
fn min_p_cuts_below_fraction_of_max() {
    // p = 0.5, 0.3, 0.15, 0.05; min_p 0.2 -> threshold 0.1: drops 0.05.
    let logits = ln_probs(&[0.5, 0.3, 0.15, 0.05]);
    let mut c = Candidates::from_logits(&logits);
    MinP(0.2).apply(&mut c);
    assert_eq!(sorted_ids(&c), vec![0, 1, 2]);
    // min_p 0.5 -> threshold 0.25: keeps 0.5 and 0.3 only.
    let mut c = Candidates::from_logits(&logits);
    MinP(0.5).apply(&mut c);
    assert_eq!(sorted_ids(&c), vec![0, 1]);
    // min_p 1: only the top token; 0: disabled.
    let mut c = Candidates::from_logits(&logits);
    MinP(1.0).apply(&mut c);
    assert_eq!(sorted_ids(&c), vec![0]);
    let mut c = Candidates::from_logits(&logits);
    MinP(0.0).apply(&mut c);
    assert_eq!(c.len(), 4);
}

#[test]
fn min_p_is_relative_to_the_max_not_absolute() {
    // Flat over 1000 tokens: every p = 0.001 < 0.05 but all equal the max.
    let mut c = Candidates::from_logits(&vec![1.0f32; 1000]);
    MinP(0.05).apply(&mut c);
    assert_eq!(c.len(), 1000);
}

// ---- temperature ----

#[test]
fn temperature_scales_logits() {
    let mut c = Candidates::from_logits(&[2.0, -1.0]);
    Temperature(0.5).apply(&mut c);
    assert_close(logit(&c, 0), 4.0);
    assert_close(logit(&c, 1), -2.0);
    let mut c = Candidates::from_logits(&[2.0, -1.0]);
    Temperature(2.0).apply(&mut c);
    assert_close(logit(&c, 0), 1.0);
}

// ---- greedy and dist ----

#[test]
fn argmax_breaks_ties_to_lowest_id() {
    let c = Candidates::from_logits(&[1.0, 3.0, 0.0, 3.0]);
    assert_eq!(greedy::argmax(&c), Some(1));
    assert_eq!(greedy::argmax(&Candidates::default()), None);
}

#[test]
fn dist_never_picks_impossible_tokens() {
    let c = Candidates::from_logits(&[f32::NEG_INFINITY, 0.0, f32::NAN, 0.0]);
    let mut rng = Xoshiro256StarStar::seed_from_u64(1);
    for _ in 0..1000 {
        let t = dist::sample(&c, &mut rng).expect("non-empty");
        assert!(t == 1 || t == 3, "picked {t}");
    }
}

#[test]
fn dist_handles_infinite_logits() {
    let c = Candidates::from_logits(&[0.0, f32::INFINITY, 5.0]);
    let mut rng = Xoshiro256StarStar::seed_from_u64(1);
    for _ in 0..100 {
        assert_eq!(dist::sample(&c, &mut rng), Some(1));
    }
    let c = Candidates::from_logits(&[f32::NEG_INFINITY; 3]);
    assert_eq!(dist::sample(&c, &mut rng), Some(0));
    assert_eq!(dist::sample(&Candidates::default(), &mut rng), None);
}
