//! The shared recipes (kestrel_models::backend::dense, ::moe) carried out by the CPU backend
//! give the same logits as the CPU serving path's own recipes, on the tiny fixtures: the
//! recipe the GPU runs is the one the CPU is checked with. Tolerance: 1e-5 absolute (same
//! kernels, same order; only the thread-pool grouping differs).

use kestrel_gguf::GgufFile;
use kestrel_models::backend::cpu::CpuBackend;
use kestrel_models::weights::TensorStore;
use kestrel_models::{
    KvType, LoadOptions, Logits, MatmulPath, Model, ModelConfig, SeqStep, WantLogits,
};
use std::path::Path;

const TOLERANCE: f32 = 1e-5;

fn check(arch: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/tiny")
        .join(format!("tiny-{arch}"))
        .join(format!("{arch}-f32.gguf"));
    let file = GgufFile::open(&path).expect("fixture opens");
    let cfg = ModelConfig::from_gguf(&file.header).expect("config");
    let opts = LoadOptions {
        threads: 2,
        matmul: MatmulPath::Reference,
        ..LoadOptions::default()
    };
    let model = Model::from_gguf(&file, opts, &mut |_, _| {}).expect("model");
    let store = TensorStore::from_gguf(&file);
    let mut seam =
        CpuBackend::load(&store, cfg.clone(), 8, 16, 2, MatmulPath::Reference).expect("backend");
    let prompt: Vec<u32> = (0..37)
        .map(|i| (i * 13 + 5) % cfg.vocab_size as u32)
        .collect();
    let mut cache = model.new_cache(64, KvType::F32);
    let want = model
        .forward(&prompt, &mut cache, Logits::All)
        .expect("forward");
    let blocks: Vec<u32> = (0..8).rev().collect(); // a non-identity table
    let got = seam
        .forward(&[SeqStep {
            tokens: &prompt,
            start: 0,
            blocks: &blocks,
            slot: 0,
            want: WantLogits::All,
        }])
        .expect("seam forward");
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert_eq!(got.len(), want.len());
    assert!(
        worst <= TOLERANCE,
        "{arch}: prompt logits differ by {worst}"
    );
    // one decode step on top
    let next = [7u32];
    let want = model
        .forward(&next, &mut cache, Logits::Last)
        .expect("decode");
    let got = seam
        .forward(&[SeqStep {
            tokens: &next,
            start: prompt.len(),
            blocks: &blocks,
            slot: 0,
            want: WantLogits::Last,
        }])
        .expect("seam decode");
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= TOLERANCE,
        "{arch}: decode logits differ by {worst}"
    );
}

#[test]
fn shared_recipe_matches_the_cpu_recipes_llama() {
    check("llama");
}

#[test]
fn shared_recipe_matches_the_cpu_recipes_qwen2() {
    check("qwen2");
}

#[test]
fn shared_recipe_matches_the_cpu_recipes_qwen3() {
    check("qwen3");
}

#[test]
fn shared_recipe_matches_the_cpu_recipes_qwen3_moe() {
    check("qwen3_moe");
}
