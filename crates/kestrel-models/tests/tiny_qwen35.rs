//! Qwen3.5 (hybrid gated DeltaNet + gated attention) on tiny-qwen3_5 against transformers'
//! float64 reference: logits at every position of every reference prompt within 1e-3, the 24
//! greedy tokens equal, from the Hugging Face folder and from llama.cpp's GGUF; and the
//! recurrent state handed from a chunked prefill to one-token decode steps exactly.

mod common;

use common::{argmax_top2, max_abs, reference, tiny_dir};
use kestrel_models::{KvType, LoadOptions, Logits, MatmulPath, Model};
use std::path::{Path, PathBuf};

const ARCH: &str = "qwen3_5";
/// Max-abs logit error allowed against the float64 transformers reference.
const LOGIT_TOLERANCE: f32 = 1e-3;
/// Where our top-2 logits are closer than this, either greedy choice is right.
const NEAR_TIE: f32 = 1e-3;
/// Prefill vs token-by-token: the same arithmetic up to the order of f32 sums.
const STEPWISE_TOLERANCE: f32 = 1e-4;

fn gguf() -> PathBuf {
    tiny_dir(ARCH).join("qwen3_5-f32.gguf")
}

fn load(path: &Path, matmul: MatmulPath, max_batch: usize) -> Model {
    let opts = LoadOptions {
        threads: 2,
        matmul,
        max_batch,
        ..Default::default()
    };
    Model::load(path, opts, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

fn check(path: &Path, matmul: MatmulPath) {
    // max_batch 128: the 300-token prompt runs in three steps, the state carried between them.
    let model = load(path, matmul, 128);
    let vocab = model.config.vocab_size;
    for (ci, case) in reference(ARCH).iter().enumerate() {
        let mut cache = model.new_cache(case.tokens.len() + 32, KvType::F32);
        let logits = model
            .forward(&case.tokens, &mut cache, Logits::All)
            .expect("forward");
        let err = max_abs(&logits, &case.logits);
        eprintln!(
            "{} {matmul:?} case {ci}: T={} max-abs logit error {err:.2e}",
            path.display(),
            case.tokens.len()
        );
        assert!(
            err <= LOGIT_TOLERANCE,
            "{} case {ci}: max-abs logit error {err} > {LOGIT_TOLERANCE}",
            path.display()
        );
        let mut last = logits[logits.len() - vocab..].to_vec();
        for (k, &want) in case.greedy.iter().enumerate() {
            let (got, gap) = argmax_top2(&last);
            if got != want {
                assert!(
                    gap < NEAR_TIE,
                    "{} case {ci}: greedy token {k} is {got}, reference {want} (gap {gap})",
                    path.display()
                );
                break;
            }
            last = model
                .forward(&[got], &mut cache, Logits::Last)
                .expect("decode");
        }
    }
}

#[test]
fn qwen35_matches_transformers_from_safetensors() {
    check(&tiny_dir(ARCH), MatmulPath::Reference);
    check(&tiny_dir(ARCH), MatmulPath::Quantized);
}

#[test]
fn qwen35_matches_transformers_from_gguf() {
    check(&gguf(), MatmulPath::Reference);
    check(&gguf(), MatmulPath::Quantized);
}

/// The 300-token prompt as 300 one-token steps (recurrent form) and as one prefill (chunked
/// form): equal logits at every position.
#[test]
fn qwen35_stepwise_decode_equals_prefill() {
    let model = load(&gguf(), MatmulPath::Reference, 512);
    let case = &reference(ARCH)[3];
    let n = case.tokens.len();
    let mut cache = model.new_cache(n, KvType::F32);
    let prefill = model
        .forward(&case.tokens, &mut cache, Logits::All)
        .unwrap();
    let mut cache = model.new_cache(n, KvType::F32);
    let mut steps = Vec::new();
    for &t in &case.tokens {
        steps.extend(model.forward(&[t], &mut cache, Logits::Last).unwrap());
    }
    let err = max_abs(&prefill, &steps);
    eprintln!("300 steps vs one prefill: max-abs difference {err:.2e}");
    eprintln!(
        "vs reference: prefill {:.2e}, steps {:.2e}",
        max_abs(&prefill, &case.logits),
        max_abs(&steps, &case.logits)
    );
    assert!(err <= STEPWISE_TOLERANCE, "stepwise vs prefill: {err}");
}

/// Prefill split at positions that are not chunk boundaries, continued from the handed-over
/// convolution window and state: the same logits as one prefill.
#[test]
fn qwen35_prefill_in_pieces_equals_one_prefill() {
    let model = load(&gguf(), MatmulPath::Reference, 512);
    let case = &reference(ARCH)[3];
    let mut cache = model.new_cache(300, KvType::F32);
    let whole = model
        .forward(&case.tokens, &mut cache, Logits::All)
        .unwrap();
    let mut cache = model.new_cache(300, KvType::F32);
    let mut pieces = Vec::new();
    for (a, b) in [(0, 2), (2, 3), (3, 70), (70, 128), (128, 129), (129, 300)] {
        pieces.extend(
            model
                .forward(&case.tokens[a..b], &mut cache, Logits::All)
                .unwrap(),
        );
    }
    let err = max_abs(&whole, &pieces);
    assert!(err <= STEPWISE_TOLERANCE, "pieces vs one prefill: {err}");
}

/// A hybrid model's cache cannot be rewound to a middle position; back to 0 works.
#[test]
fn qwen35_truncated_cache_is_refused_then_restarts_at_zero() {
    let model = load(&gguf(), MatmulPath::Reference, 512);
    let case = &reference(ARCH)[1];
    let mut cache = model.new_cache(64, KvType::F32);
    let first = model
        .forward(&case.tokens, &mut cache, Logits::Last)
        .unwrap();
    cache.truncate(3);
    let err = model.forward(&case.tokens[3..], &mut cache, Logits::Last);
    assert!(err.is_err(), "resuming a rewound hybrid cache must fail");
    cache.truncate(0);
    let again = model
        .forward(&case.tokens, &mut cache, Logits::Last)
        .unwrap();
    assert_eq!(first, again);
}

/// Several sequences in one batched step, each with its own state slot and shuffled KV blocks,
/// give the same logits as each run alone; a snapshot copied into another slot resumes there.
#[test]
fn qwen35_batched_slots_equal_one_sequence_at_a_time() {
    use kestrel_models::{SeqStep, WantLogits};
    let model = load(&gguf(), MatmulPath::Reference, 512);
    let cases = reference(ARCH);
    let prompts: Vec<&[u32]> = vec![&cases[2].tokens, &cases[1].tokens, &cases[3].tokens[..90]];
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut c = model.new_cache(128, KvType::F32);
            model.forward(p, &mut c, Logits::All).unwrap()
        })
        .collect();
    let bs = 4;
    let mut pool = model.new_pool(96, bs, KvType::F32);
    let mut states = model.new_state_pool(4);
    let tables: Vec<Vec<u32>> = (0..3u32)
        .map(|s| (0..32u32).map(|i| i * 3 + s).collect())
        .collect();
    // slots 2, 0, 3 (slot 1 stays free for a snapshot)
    let slots = [2usize, 0, 3];
    let mut got: Vec<Vec<f32>> = vec![Vec::new(); 3];
    for half in 0..2 {
        let steps: Vec<SeqStep> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mid = p.len() / 2;
                let (start, toks) = if half == 0 {
                    (0, &p[..mid])
                } else {
                    (mid, &p[mid..])
                };
                SeqStep {
                    tokens: toks,
                    start,
                    blocks: &tables[i],
                    slot: slots[i],
                    want: WantLogits::All,
                }
            })
            .collect();
        if half == 1 {
            // move sequence 0's state to slot 1 mid-prompt: a snapshot and a resume from it
            states.copy_slot(2, 1);
            states.reset(2);
        }
        let steps: Vec<SeqStep> = steps
            .into_iter()
            .map(|s| SeqStep {
                slot: if half == 1 && s.slot == 2 { 1 } else { s.slot },
                ..s
            })
            .collect();
        let out = model.forward_batch(&mut pool, &mut states, &steps).unwrap();
        let mut off = 0;
        for (i, s) in steps.iter().enumerate() {
            let n = s.tokens.len() * model.config.vocab_size;
            got[i].extend_from_slice(&out[off..off + n]);
            off += n;
        }
    }
    for (a, b) in alone.iter().zip(&got) {
        let err = max_abs(a, b);
        assert!(err < 1e-5, "batched vs alone: max error {err}");
    }
}
