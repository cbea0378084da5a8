//! Replays the fuzz corpus (fuzz/corpus/gguf_parse/, committed) through `parse`, so CI checks
//! every input the fuzzer kept, and every crash it ever found, without running a fuzzer.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

#[test]
fn fuzz_corpus_never_panics() {
    let dir = common::repo_root().join("fuzz/corpus/gguf_parse");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(files.len() >= 20, "corpus at {} looks empty", dir.display());
    let (mut ok, mut err) = (0, 0);
    for path in &files {
        let data = std::fs::read(path).unwrap();
        let result = catch_unwind(AssertUnwindSafe(|| kestrel_gguf::parse(&data)))
            .unwrap_or_else(|_| panic!("parse panicked on {}", path.display()));
        match result {
            Ok(h) => {
                ok += 1;
                // The same invariants the fuzz target asserts.
                assert_eq!(h.data_offset % h.alignment, 0, "{}", path.display());
                let mut sum = 0;
                for t in &h.tensors {
                    let end = h.data_offset + t.offset + t.n_bytes;
                    assert!(end <= data.len() as u64, "{}: {}", path.display(), t.name);
                    assert_eq!(t.ggml_type.bytes_for(t.n_elements()), Some(t.n_bytes));
                    sum += t.n_bytes;
                }
                assert_eq!(h.tensor_bytes(), sum);
                for (_, v) in &h.metadata {
                    let _ = v.summary();
                }
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                err += 1;
            }
        }
    }
    eprintln!("{} corpus files: {ok} parsed, {err} rejected", files.len());
}
