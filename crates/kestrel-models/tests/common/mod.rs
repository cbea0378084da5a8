//! The tiny random-weight models and their transformers references (testdata/tiny).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub fn tiny_dir(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/tiny")
        .join(format!("tiny-{arch}"))
}

/// One reference sequence: prompt ids, logits at every prompt position `[T, vocab]`, and the
/// 24-token greedy continuation.
pub struct Case {
    pub tokens: Vec<u32>,
    pub logits: Vec<f32>,
    pub greedy: Vec<u32>,
}

pub fn reference(arch: &str) -> Vec<Case> {
    let bytes =
        std::fs::read(tiny_dir(arch).join("reference.safetensors")).expect("reference file");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("reference parses");
    let words = |name: &str| -> Vec<[u8; 4]> {
        let t = st.tensor(name).expect(name);
        t.data()
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect()
    };
    (0..4)
        .map(|i| Case {
            tokens: words(&format!("tokens_{i}"))
                .into_iter()
                .map(|w| i32::from_le_bytes(w) as u32)
                .collect(),
            logits: words(&format!("logits_{i}"))
                .into_iter()
                .map(f32::from_le_bytes)
                .collect(),
            greedy: words(&format!("greedy_{i}"))
                .into_iter()
                .map(|w| i32::from_le_bytes(w) as u32)
                .collect(),
        })
        .collect()
}

pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// The highest logit's id (lowest id on ties) and its lead over the second.
pub fn argmax_top2(logits: &[f32]) -> (u32, f32) {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    (idx[0] as u32, logits[idx[0]] - logits[idx[1]])
}
