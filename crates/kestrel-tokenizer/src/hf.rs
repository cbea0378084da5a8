//! Loading from an HF model directory (`tokenizer.json`, `tokenizer_config.json`).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::DecoderWrapper;

use crate::vocab::{SpecialIds, TokenType, Vocab};
use crate::{Tokenizer, TokenizerError};

fn read_json(path: &Path) -> Result<Option<Value>, TokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizerError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::Parse {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// `"<s>"` or `{"content": "<s>", ...}` (both appear in tokenizer_config.json).
fn token_content(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// The chat template: a string, or a list of named templates (take "default").
fn chat_template(config: Option<&Value>, dir: &Path) -> Option<String> {
    match config.and_then(|c| c.get("chat_template")) {
        Some(Value::String(s)) => return Some(s.clone()),
        Some(Value::Array(list)) => {
            let pick = list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| list.first());
            if let Some(s) = pick.and_then(|t| t.get("template")).and_then(Value::as_str) {
                return Some(s.to_string());
            }
        }
        _ => {}
    }
    // Newer transformers save the template beside the config.
    std::fs::read_to_string(dir.join("chat_template.jinja")).ok()
}

pub(crate) fn load(dir: &Path) -> Result<Tokenizer, TokenizerError> {
    let json_path: PathBuf = dir.join("tokenizer.json");
    let mut inner =
        tokenizers::Tokenizer::from_file(&json_path).map_err(|e| TokenizerError::Parse {
            path: json_path.clone(),
            reason: e.to_string(),
        })?;
    let config = read_json(&dir.join("tokenizer_config.json"))?;
    let generation = read_json(&dir.join("generation_config.json"))?;

    // Id → text table over the model vocabulary and the added tokens.
    let full = inner.get_vocab(true);
    let n = full.values().max().map_or(0, |&m| m as usize + 1);
    let mut texts = vec![String::new(); n];
    for (text, &id) in &full {
        texts[id as usize] = text.clone();
    }
    let mut types = vec![TokenType::Normal; n];
    for (id, added) in inner.get_added_tokens_decoder() {
        if let Some(slot) = types.get_mut(id as usize) {
            *slot = if added.special {
                TokenType::Control
            } else {
                TokenType::UserDefined
            };
        }
    }
    for (id, t) in texts.iter().enumerate() {
        if t.is_empty() {
            types[id] = TokenType::Unused;
        }
    }
    let byte_level = matches!(inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
    let mut vocab = Vocab::new(texts, types, byte_level);

    let lookup = |key: &str| {
        token_content(config.as_ref().and_then(|c| c.get(key)))
            .and_then(|t| vocab.text_to_id.get(t).copied())
    };
    let given = SpecialIds {
        bos: lookup("bos_token"),
        eos: lookup("eos_token"),
        pad: lookup("pad_token"),
        unk: lookup("unk_token"),
        ..SpecialIds::default()
    };
    let (specials, mut eog) = vocab.resolve_specials(given, byte_level);
    // generation_config.json may list more stop ids (e.g. Llama 3's eot).
    if let Some(ids) = generation.as_ref().and_then(|g| g.get("eos_token_id")) {
        let extra: Vec<u64> = match ids {
            Value::Array(a) => a.iter().filter_map(Value::as_u64).collect(),
            v => v.as_u64().into_iter().collect(),
        };
        eog.extend(
            extra
                .into_iter()
                .filter(|&id| (id as usize) < vocab.len())
                .map(|id| id as u32),
        );
        eog.sort_unstable();
        eog.dedup();
    }

    // add_bos: the config says so, or the post-processor inserts BOS itself.
    let add_bos = match config.as_ref().and_then(|c| c.get("add_bos_token")) {
        Some(Value::Bool(b)) => *b,
        _ => match (specials.bos, inner.encode("", true)) {
            (Some(bos), Ok(enc)) => enc.get_ids().first() == Some(&bos),
            _ => false,
        },
    };
    let add_eos = config
        .as_ref()
        .and_then(|c| c.get("add_eos_token"))
        .and_then(Value::as_bool)
        .unwrap_or(false);

    // Special tokens are matched by `Vocab::partition`; the inner tokenizer sees their text as
    // plain text, and its post-processor is bypassed (`encode(.., false)`).
    inner.set_encode_special_tokens(true);

    let model = serde_json::to_value(inner.get_model())
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    let pre = inner
        .get_pre_tokenizer()
        .and_then(|p| serde_json::to_value(p).ok())
        .map(|v| describe_pre(&v))
        .unwrap_or_else(|| "none".into());
    let level = if byte_level { " byte-level" } else { "" };

    Ok(Tokenizer {
        inner,
        vocab,
        specials,
        eog,
        add_bos,
        add_eos,
        chat_template: chat_template(config.as_ref(), dir),
        kind: format!("tokenizer.json{level} {model} (pre: {pre})"),
    })
}

/// "ByteLevel", or "Sequence[Split, ByteLevel]".
fn describe_pre(v: &Value) -> String {
    let ty = v.get("type").and_then(Value::as_str).unwrap_or("?");
    match v.get("pretokenizers").and_then(Value::as_array) {
        Some(list) => format!(
            "{ty}[{}]",
            list.iter().map(describe_pre).collect::<Vec<_>>().join(", ")
        ),
        None => ty.to_string(),
    }
}
