//! GGUF metadata for a Hugging Face folder, as llama.cpp's converter writes it: the
//! architecture's hyper-parameters from config.json, and the byte-level BPE vocabulary
//! (tokens, their types, merges, special ids, chat template) from tokenizer.json and
//! tokenizer_config.json.

use super::QuantMix;
use crate::config::{Arch, ModelConfig};
use crate::ModelError;
use kestrel_gguf::Value;
use serde_json::Value as Json;
use std::path::Path;

// llama.cpp's token types
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

fn read_json(path: &Path, required: bool) -> Result<Option<Json>, ModelError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(_) if !required => return Ok(None),
        Err(source) => {
            return Err(ModelError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::BadFile {
            path: path.to_path_buf(),
            reason: format!("invalid JSON: {e}"),
        })
}

pub fn metadata(
    dir: &Path,
    cfg: &ModelConfig,
    mix: QuantMix,
) -> Result<Vec<(String, Value)>, ModelError> {
    let config = read_json(&dir.join("config.json"), true)?.unwrap_or_default();
    let config = match config.get("text_config") {
        Some(t) if t.is_object() => t.clone(),
        _ => config,
    };
    let tok_path = dir.join("tokenizer.json");
    let tok = read_json(&tok_path, true)?.unwrap_or_default();
    let tok_cfg = read_json(&dir.join("tokenizer_config.json"), false)?.unwrap_or_default();

    let arch = cfg.arch.name();
    let mut md: Vec<(String, Value)> = Vec::new();
    let mut put = |k: &str, v: Value| md.push((k.to_string(), v));
    let u32v = |n: usize| Value::U32(n as u32);
    put("general.architecture", Value::String(arch.into()));
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    put("general.name", Value::String(name));
    let key = |k: &str| format!("{arch}.{k}");
    put(&key("block_count"), u32v(cfg.n_layers));
    put(&key("context_length"), u32v(cfg.max_context));
    put(&key("embedding_length"), u32v(cfg.dim));
    put(&key("feed_forward_length"), u32v(cfg.ffn_dim));
    put(&key("attention.head_count"), u32v(cfg.n_heads));
    put(&key("attention.head_count_kv"), u32v(cfg.n_kv_heads));
    put(&key("rope.freq_base"), Value::F32(cfg.rope_base));
    put(
        &key("attention.layer_norm_rms_epsilon"),
        Value::F32(cfg.rms_eps),
    );
    if config.get("head_dim").is_some_and(|v| v.is_u64()) {
        put(&key("attention.key_length"), u32v(cfg.head_dim));
        put(&key("attention.value_length"), u32v(cfg.head_dim));
    }
    if let Some(m) = &cfg.moe {
        put(&key("expert_count"), u32v(m.n_experts));
        put(&key("expert_used_count"), u32v(m.n_used));
        put(&key("expert_feed_forward_length"), u32v(m.expert_ffn_dim));
        if !m.norm_top_k {
            put(&key("expert_weights_norm"), Value::Bool(false));
        }
    }
    if cfg.arch == Arch::Llama {
        put(&key("vocab_size"), u32v(cfg.vocab_size));
        put(&key("rope.dimension_count"), u32v(cfg.rope_dim));
    }
    put("general.file_type", Value::U32(mix.file_type()));
    put("general.quantization_version", Value::U32(2));
    md.extend(vocabulary(&tok, &tok_cfg, &config, cfg, &tok_path)?);
    Ok(md)
}

/// The `tokenizer.ggml.*` keys of a byte-level BPE tokenizer.json.
fn vocabulary(
    tok: &Json,
    tok_cfg: &Json,
    config: &Json,
    cfg: &ModelConfig,
    path: &Path,
) -> Result<Vec<(String, Value)>, ModelError> {
    let bad = |reason: String| ModelError::BadFile {
        path: path.to_path_buf(),
        reason,
    };
    let model = &tok["model"];
    if model["type"].as_str() != Some("BPE") {
        return Err(bad(format!(
            "a {} tokenizer: only byte-level BPE vocabularies are converted",
            model["type"]
        )));
    }
    let n = cfg.vocab_size;
    let mut tokens: Vec<Option<(String, i32)>> = vec![None; n];
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad("model.vocab is not an object".into()))?;
    for (piece, id) in vocab {
        if let Some(slot) = id.as_u64().and_then(|i| tokens.get_mut(i as usize)) {
            *slot = Some((piece.clone(), NORMAL));
        }
    }
    let added = tok["added_tokens"].as_array().cloned().unwrap_or_default();
    for a in &added {
        let (Some(id), Some(content)) = (a["id"].as_u64(), a["content"].as_str()) else {
            continue;
        };
        let looks_special = content.starts_with("<|") && content.ends_with("|>");
        let ty = if a["special"].as_bool().unwrap_or(false) || looks_special {
            CONTROL
        } else {
            USER_DEFINED
        };
        if let Some(slot) = tokens.get_mut(id as usize) {
            *slot = Some((content.to_string(), ty));
        }
    }
    let (pieces, types): (Vec<Value>, Vec<Value>) = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let (p, ty) = t.unwrap_or_else(|| (format!("[PAD{i}]"), UNUSED));
            (Value::String(p), Value::I32(ty))
        })
        .unzip();
    let merges: Vec<Value> = model["merges"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|x| match x {
                    Json::String(s) => Some(s.clone()),
                    Json::Array(pair) => Some(format!(
                        "{} {}",
                        pair.first()?.as_str()?,
                        pair.get(1)?.as_str()?
                    )),
                    _ => None,
                })
                .map(Value::String)
                .collect()
        })
        .unwrap_or_default();

    let id_of = |content: &str| -> Option<u32> {
        added
            .iter()
            .find(|a| a["content"].as_str() == Some(content))
            .and_then(|a| a["id"].as_u64())
            .or_else(|| vocab.get(content).and_then(|v| v.as_u64()))
            .map(|v| v as u32)
    };
    // a special token named in tokenizer_config.json, else config.json's id
    let special = |which: &str| -> Option<u32> {
        let named = match &tok_cfg[format!("{which}_token")] {
            Json::String(s) => Some(s.as_str()),
            Json::Object(o) => o.get("content").and_then(|c| c.as_str()),
            _ => None,
        };
        named.and_then(id_of).or_else(|| {
            config[format!("{which}_token_id")]
                .as_u64()
                .map(|v| v as u32)
        })
    };

    let mut md: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        (
            "tokenizer.ggml.pre".into(),
            Value::String(pre_tokenizer(tok, cfg.arch).map_err(bad)?.into()),
        ),
        ("tokenizer.ggml.tokens".into(), Value::Array(pieces)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
    ];
    for (which, key) in [
        ("bos", "tokenizer.ggml.bos_token_id"),
        ("eos", "tokenizer.ggml.eos_token_id"),
        ("pad", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(id) = special(which) {
            md.push((key.into(), Value::U32(id)));
        }
    }
    if let Some(add) = tok_cfg["add_bos_token"].as_bool() {
        md.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(add)));
    }
    let template = match &tok_cfg["chat_template"] {
        Json::String(s) => Some(s.clone()),
        _ => std::fs::read_to_string(path.with_file_name("chat_template.jinja")).ok(),
    };
    if let Some(t) = template {
        md.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    Ok(md)
}

/// llama.cpp's `tokenizer.ggml.pre` name for the folder's pre-tokenizer: the Qwen families
/// split as `qwen2`; otherwise read from the split regex (llama 3's groups digits by three).
fn pre_tokenizer(tok: &Json, arch: Arch) -> Result<&'static str, String> {
    match arch {
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => return Ok("qwen2"),
        Arch::Qwen35 => return Ok("qwen35"),
        Arch::Llama => {}
    }
    let text = tok["pre_tokenizer"].to_string();
    if text.contains(r"\\p{N}{1,3}") {
        Ok("llama-bpe")
    } else if tok["pre_tokenizer"]["type"].as_str() == Some("ByteLevel") {
        Ok("gpt-2")
    } else {
        Err("a pre-tokenizer llama.cpp has no name for here; convert the folder with llama.cpp's convert_hf_to_gguf.py".into())
    }
}
