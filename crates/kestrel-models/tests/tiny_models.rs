//! Parity with transformers on the tiny random-weight models (testdata/tiny, float64 references;
//! qwen3_moe's in float32): logits at every prompt position within 1e-3 (2e-3 for qwen3_moe),
//! and the 24 greedy tokens equal.

use kestrel_models::{KvType, LoadOptions, Logits, MatmulPath, Model};
use std::path::{Path, PathBuf};

/// Max-abs logit error allowed against the float64 transformers reference.
const LOGIT_TOLERANCE: f32 = 1e-3;
/// ... and against qwen3_moe's float32 one (transformers' grouped expert matmul has no float64
/// kernel).
const MOE_LOGIT_TOLERANCE: f32 = 2e-3;
/// Where our top-2 logits are closer than this, either greedy choice is right.
const NEAR_TIE: f32 = 1e-3;

fn tiny_dir(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/tiny")
        .join(format!("tiny-{arch}"))
}

struct Case {
    tokens: Vec<u32>,
    logits: Vec<f32>,
    greedy: Vec<u32>,
}

fn reference(arch: &str) -> Vec<Case> {
    let bytes =
        std::fs::read(tiny_dir(arch).join("reference.safetensors")).expect("reference file");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("reference parses");
    let i32s = |name: &str| -> Vec<u32> {
        let t = st.tensor(name).expect(name);
        t.data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect()
    };
    let f32s = |name: &str| -> Vec<f32> {
        let t = st.tensor(name).expect(name);
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    (0..4)
        .map(|i| Case {
            tokens: i32s(&format!("tokens_{i}")),
            logits: f32s(&format!("logits_{i}")),
            greedy: i32s(&format!("greedy_{i}")),
        })
        .collect()
}

fn load(path: &Path, matmul: MatmulPath) -> Model {
    let opts = LoadOptions {
        threads: 2,
        matmul,
        max_batch: 128,
        ..Default::default()
    };
    Model::load(path, opts, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

fn argmax_top2(logits: &[f32]) -> (u32, f32) {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    (idx[0] as u32, logits[idx[0]] - logits[idx[1]])
}

fn check_model(arch: &str, path: &Path, matmul: MatmulPath) {
    let model = load(path, matmul);
    let vocab = model.config.vocab_size;
    for (ci, case) in reference(arch).iter().enumerate() {
        // Logits at every prompt position (max_batch 128 splits the 300-token prompt in steps).
        let mut cache = model.new_cache(case.tokens.len() + 32, KvType::F32);
        let logits = model
            .forward(&case.tokens, &mut cache, Logits::All)
            .expect("forward");
        assert_eq!(logits.len(), case.logits.len());
        let max_err = logits
            .iter()
            .zip(&case.logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let tolerance = if arch == "qwen3_moe" {
            MOE_LOGIT_TOLERANCE
        } else {
            LOGIT_TOLERANCE
        };
        assert!(
            max_err <= tolerance,
            "{arch} {} case {ci} (T={}): max-abs logit error {max_err} > {tolerance}",
            path.display(),
            case.tokens.len()
        );

        eprintln!(
            "{arch} {} case {ci}: T={} max-abs logit error {max_err:.2e}",
            path.display(),
            case.tokens.len()
        );
        // 24 greedy tokens, decoding one at a time on the cache.
        let mut last = logits[logits.len() - vocab..].to_vec();
        for (k, &want) in case.greedy.iter().enumerate() {
            let (got, gap) = argmax_top2(&last);
            if got != want {
                assert!(
                    gap < NEAR_TIE,
                    "{arch} {} case {ci}: greedy token {k} is {got}, reference {want} (top-2 gap {gap})",
                    path.display()
                );
                break; // a legitimate near-tie flip: the rest of the continuation differs
            }
            last = model
                .forward(&[got], &mut cache, Logits::Last)
                .expect("decode");
        }
    }
}

#[test]
fn tiny_models_match_transformers_from_safetensors() {
    for arch in ["llama", "qwen2", "qwen3", "qwen3_moe"] {
        check_model(arch, &tiny_dir(arch), MatmulPath::Reference);
        check_model(arch, &tiny_dir(arch), MatmulPath::Quantized);
    }
}

#[test]
fn tiny_models_match_transformers_from_gguf() {
    for arch in ["llama", "qwen2", "qwen3", "qwen3_moe"] {
        let gguf = tiny_dir(arch).join(format!("{arch}-f32.gguf"));
        check_model(arch, &gguf, MatmulPath::Reference);
        check_model(arch, &gguf, MatmulPath::Quantized);
    }
}

/// Several sequences in one batched step (paged pool, shuffled block tables) give the same
/// logits as each sequence run alone; for qwen3_moe the tokens of every sequence are grouped
/// by expert together.
#[test]
fn batched_paged_forward_equals_one_sequence_at_a_time() {
    for arch in ["qwen2", "qwen3_moe"] {
        batched_equals_alone(arch);
    }
}

fn batched_equals_alone(arch: &str) {
    use kestrel_models::{KvPool, SeqStep, StatePool, WantLogits};
    let model = load(
        &tiny_dir(arch).join(format!("{arch}-f32.gguf")),
        MatmulPath::Quantized,
    );
    let cases = reference(arch);
    let prompts: Vec<&[u32]> = vec![&cases[1].tokens, &cases[2].tokens[..40], &cases[0].tokens];
    // Alone, on private caches.
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut c = model.new_cache(64, KvType::F32);
            model.forward(p, &mut c, Logits::All).unwrap()
        })
        .collect();
    // Together: block size 4, tables interleaved across sequences.
    let bs = 4;
    let mut pool: KvPool = model.new_pool(64, bs, KvType::F32);
    let tables: Vec<Vec<u32>> = (0..3u32)
        .map(|s| (0..16u32).map(|i| i * 3 + s).collect())
        .collect();
    // First half of each prompt in one step, then the rest in a second step.
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
                    slot: 0,
                    want: WantLogits::All,
                }
            })
            .collect();
        let out = model
            .forward_batch(&mut pool, &mut StatePool::empty(), &steps)
            .unwrap();
        let mut off = 0;
        for (i, s) in steps.iter().enumerate() {
            let n = s.tokens.len() * model.config.vocab_size;
            got[i].extend_from_slice(&out[off..off + n]);
            off += n;
        }
    }
    for (a, b) in alone.iter().zip(&got) {
        let err = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-5, "{arch} batched vs alone: max error {err}");
    }
}
