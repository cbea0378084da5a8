//! The reader's API on the tiny models in testdata/tiny/ (and on the real models when present):
//! metadata values, tensor index, sizes from type and shape, tensor data slices.

mod common;

use common::{read_prefix, real_models, tensor_size};
use kestrel_gguf::{parse, GgmlType, GgufFile, Header, Value};
use std::path::Path;

/// (folder, file, architecture, block_count, tensor count), as written by llama.cpp's converter.
const TINY: &[(&str, &str, &str, u64, usize)] = &[
    ("tiny-llama", "llama-f32.gguf", "llama", 4, 38),
    ("tiny-qwen2", "qwen2-f32.gguf", "qwen2", 4, 51),
    ("tiny-qwen3", "qwen3-f32.gguf", "qwen3", 4, 47),
    ("tiny-qwen3_5", "qwen3_5-f32.gguf", "qwen35", 8, 109),
    ("tiny-qwen3_moe", "qwen3_moe-f32.gguf", "qwen3moe", 4, 51),
];

fn tiny_path(folder: &str, file: &str) -> std::path::PathBuf {
    common::repo_root()
        .join("testdata/tiny")
        .join(folder)
        .join(file)
}

/// The config.json next to a tiny GGUF, for a few numbers to cross-check (no JSON dependency:
/// the values looked up are plain integers).
fn config_int(dir: &Path, key: &str) -> u64 {
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let pat = format!("\"{key}\":");
    let at = text
        .find(&pat)
        .unwrap_or_else(|| panic!("{key} not in config.json"))
        + pat.len();
    let digits: String = text[at..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().unwrap()
}

fn check_sizes(h: &Header) {
    let mut sum = 0;
    for t in &h.tensors {
        let want = tensor_size(t.ggml_type.id(), &t.dims);
        assert_eq!(
            t.n_bytes, want,
            "tensor {} ({} {:?})",
            t.name, t.ggml_type, t.dims
        );
        assert_eq!(t.n_elements(), t.dims.iter().product::<u64>());
        assert_eq!(t.offset % h.alignment, 0, "tensor {}", t.name);
        sum += want;
    }
    assert_eq!(h.tensor_bytes(), sum);
}

#[test]
fn tiny_models_metadata_and_tensors() {
    assert_eq!(
        common::tiny_ggufs().len(),
        TINY.len(),
        "a tiny GGUF is not listed in TINY"
    );
    for &(folder, file, arch, blocks, n_tensors) in TINY {
        let path = tiny_path(folder, file);
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let h = &f.header;
        let ctx = path.display().to_string();
        assert_eq!(h.version, 3, "{ctx}");
        assert_eq!(h.architecture(), Some(arch), "{ctx}");
        assert_eq!(h.alignment, 32, "{ctx}");

        let block_count = h
            .get(&format!("{arch}.block_count"))
            .and_then(Value::as_u64);
        assert_eq!(block_count, Some(blocks), "{ctx}");
        assert_eq!(
            blocks,
            config_int(path.parent().unwrap(), "num_hidden_layers"),
            "{ctx}"
        );
        let embd = h
            .get(&format!("{arch}.embedding_length"))
            .and_then(Value::as_u64);
        assert_eq!(
            embd,
            Some(config_int(path.parent().unwrap(), "hidden_size")),
            "{ctx}"
        );

        let tokens = h
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .unwrap();
        assert_eq!(tokens.len(), 512, "{ctx}");
        assert_eq!(tokens[0].as_str(), Some("<|endoftext|>"), "{ctx}");
        assert!(tokens.iter().all(|t| t.as_str().is_some()), "{ctx}");
        let types = h
            .get("tokenizer.ggml.token_type")
            .and_then(Value::as_array)
            .unwrap();
        assert_eq!(types.len(), 512, "{ctx}");
        assert_eq!(
            h.get("tokenizer.ggml.model").and_then(Value::as_str),
            Some("gpt2")
        );
        assert_eq!(h.get("general.file_type").and_then(Value::as_u64), Some(0)); // all f32
        assert!(h.get("no.such.key").is_none());

        assert_eq!(h.tensors.len(), n_tensors, "{ctx}");
        assert!(
            h.tensors.iter().all(|t| t.ggml_type == GgmlType::F32),
            "{ctx}"
        );
        let embd_t = f.tensor("token_embd.weight").expect("token_embd.weight");
        assert_eq!(embd_t.dims, vec![64, 512], "{ctx}");
        assert_eq!(embd_t.n_bytes, 64 * 512 * 4);
        assert!(f.tensor("blk.0.attn_norm.weight").is_some(), "{ctx}");
        assert!(
            f.tensor(&format!("blk.{}.attn_norm.weight", blocks - 1))
                .is_some(),
            "{ctx}"
        );
        assert!(
            f.tensor(&format!("blk.{blocks}.attn_norm.weight"))
                .is_none(),
            "{ctx}"
        );

        check_sizes(h);

        // The data section holds exactly the tensors, each padded to the alignment.
        let data_len = f.file_len() - h.data_offset;
        let last_end = h
            .tensors
            .iter()
            .map(|t| t.offset + t.n_bytes)
            .max()
            .unwrap();
        assert_eq!(
            last_end.div_ceil(h.alignment) * h.alignment,
            data_len,
            "{ctx}"
        );
        assert!(h.tensor_bytes() <= data_len);

        // Tensor data slices have the right length and hold finite f32s.
        for t in &h.tensors {
            let d = f.tensor_data(t);
            assert_eq!(d.len() as u64, t.n_bytes);
            assert!(d
                .chunks_exact(4)
                .all(|b| f32::from_le_bytes(b.try_into().unwrap()).is_finite()));
        }
        // parse() on the bytes gives the same header as open().
        let again = parse(f.bytes()).unwrap();
        assert_eq!(again.tensors, h.tensors);
        assert_eq!(again.metadata, h.metadata);
    }
}

#[test]
fn tiny_norm_weights_match_safetensors_shape() {
    // Every 1-d tensor in the GGUF is a norm of hidden_size or head_dim: a cheap sanity check that
    // dims are read in ggml order (row length first).
    for &(folder, file, _, _, _) in TINY {
        let f = GgufFile::open(tiny_path(folder, file)).unwrap();
        for t in f
            .header
            .tensors
            .iter()
            .filter(|t| t.name.ends_with("_norm.weight"))
        {
            assert_eq!(t.dims.len(), 1, "{}", t.name);
        }
        let out = f.tensor("output_norm.weight").unwrap();
        assert_eq!(out.dims, vec![64]);
    }
}

#[test]
fn real_models_metadata_and_sizes() {
    let models = real_models("real_models_metadata_and_sizes");
    for path in models {
        let name = path.file_name().unwrap().to_str().unwrap();
        let (arch, blocks, n_tokens, n_tensors) = match name {
            "smollm2-135m-instruct-q4_1.gguf" => ("llama", 30, 49152, 272),
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" => ("qwen2", 24, 151936, 291),
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" => ("qwen2", 28, 151936, 339),
            other => {
                eprintln!("note: no expectations for {other}; checking sizes only");
                ("", 0, 0, 0)
            }
        };
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let h = &f.header;
        check_sizes(h);
        assert!(h.data_offset + h.tensor_bytes() <= f.file_len());
        if arch.is_empty() {
            continue;
        }
        assert_eq!(h.architecture(), Some(arch), "{name}");
        assert_eq!(
            h.get(&format!("{arch}.block_count"))
                .and_then(Value::as_u64),
            Some(blocks),
            "{name}"
        );
        let tokens = h
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .unwrap();
        assert_eq!(tokens.len(), n_tokens, "{name}");
        assert_eq!(h.tensors.len(), n_tensors, "{name}");
        // The header alone (first 8 MB) parses as far as the tensor data, then names a tensor.
        let prefix = read_prefix(&path, 8 << 20);
        match parse(&prefix) {
            Err(kestrel_gguf::GgufError::BadTensor { name: t, reason }) => {
                assert!(h.tensor(&t).is_some(), "{name}: {t}");
                assert!(reason.contains("past the end"), "{name}: {reason}");
            }
            other => panic!("{name}: 8 MB prefix gave {other:?}"),
        }
    }
}
