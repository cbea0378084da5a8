//! Paths and reference data the CLI's test binaries share.
#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A tiny fixture model's folder (testdata/tiny/tiny-ARCH).
pub fn tiny(arch: &str) -> PathBuf {
    root().join("testdata/tiny").join(format!("tiny-{arch}"))
}

/// An int32 tensor (`tokens_i`, `greedy_i`) of a tiny model's transformers reference.
pub fn reference_ints(arch: &str, name: &str) -> Vec<u32> {
    let bytes = std::fs::read(tiny(arch).join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}
