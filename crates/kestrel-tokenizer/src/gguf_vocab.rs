//! Reading the tokenizer out of GGUF metadata (`tokenizer.ggml.*`).

use kestrel_gguf::{Header, Value};

use crate::vocab::TokenType;
use crate::TokenizerError;

/// Everything the GGUF header says about the tokenizer, checked and typed.
#[derive(Debug, Clone)]
pub(crate) struct GgufVocab {
    pub model: String,
    /// `None` when the key is absent (llama.cpp then uses "default").
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub types: Vec<TokenType>,
    pub merges: Vec<(String, String)>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub chat_template: Option<String>,
}

fn str_array(header: &Header, key: &'static str) -> Result<Option<Vec<String>>, TokenizerError> {
    let Some(value) = header.get(key) else {
        return Ok(None);
    };
    let items = value.as_array().ok_or(TokenizerError::BadMetadata {
        key,
        reason: format!("expected an array, found {}", value.type_name()),
    })?;
    items
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            other => Err(TokenizerError::BadMetadata {
                key,
                reason: format!("expected strings, found {}", other.type_name()),
            }),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A token id key; ids outside the vocabulary are ignored, as llama.cpp does (with a warning).
fn token_id(header: &Header, key: &'static str, n_vocab: usize) -> Option<u32> {
    let id = header.get(key)?.as_u64()?;
    (id < n_vocab as u64).then_some(id as u32)
}

impl GgufVocab {
    pub fn from_header(header: &Header) -> Result<Self, TokenizerError> {
        let model = header
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.model"))?
            .to_string();
        let pre = header
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .map(str::to_string);
        let tokens = str_array(header, "tokenizer.ggml.tokens")?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?;
        let n = tokens.len();

        let types = match header.get("tokenizer.ggml.token_type") {
            None => vec![TokenType::Normal; n],
            Some(v) => {
                let key = "tokenizer.ggml.token_type";
                let items = v.as_array().ok_or(TokenizerError::BadMetadata {
                    key,
                    reason: "expected an array".into(),
                })?;
                if items.len() != n {
                    return Err(TokenizerError::BadMetadata {
                        key,
                        reason: format!("{} types for {n} tokens", items.len()),
                    });
                }
                items
                    .iter()
                    .map(|t| t.as_i64().map(TokenType::from_gguf))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(TokenizerError::BadMetadata {
                        key,
                        reason: "expected integers".into(),
                    })?
            }
        };

        let merges = str_array(header, "tokenizer.ggml.merges")?
            .unwrap_or_default()
            .into_iter()
            .map(|m| split_merge(&m))
            .collect::<Result<Vec<_>, _>>()?;

        let get_bool = |key: &str| header.get(key).and_then(Value::as_bool);
        Ok(Self {
            bos: token_id(header, "tokenizer.ggml.bos_token_id", n),
            eos: token_id(header, "tokenizer.ggml.eos_token_id", n),
            eot: token_id(header, "tokenizer.ggml.eot_token_id", n),
            eom: token_id(header, "tokenizer.ggml.eom_token_id", n),
            pad: token_id(header, "tokenizer.ggml.padding_token_id", n),
            unk: token_id(header, "tokenizer.ggml.unknown_token_id", n),
            add_bos: get_bool("tokenizer.ggml.add_bos_token"),
            add_eos: get_bool("tokenizer.ggml.add_eos_token"),
            chat_template: header
                .get("tokenizer.chat_template")
                .and_then(Value::as_str)
                .map(str::to_string),
            model,
            pre,
            tokens,
            types,
            merges,
        })
    }
}

/// "left right": llama.cpp splits at the first space after the first byte, so a merge whose left
/// side starts with a space still splits correctly.
fn split_merge(merge: &str) -> Result<(String, String), TokenizerError> {
    let first_len = merge.chars().next().map_or(0, char::len_utf8);
    match merge[first_len..].find(' ') {
        Some(pos) => {
            let pos = first_len + pos;
            Ok((merge[..pos].to_string(), merge[pos + 1..].to_string()))
        }
        None => Err(TokenizerError::BadMetadata {
            key: "tokenizer.ggml.merges",
            reason: format!("merge {merge:?} has no space"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::split_merge;

    #[test]
    fn merges_split_after_first_char() {
        assert_eq!(split_merge("Ġ t").unwrap(), ("Ġ".into(), "t".into()));
        assert_eq!(split_merge("ĠĠ ĠĠ").unwrap(), ("ĠĠ".into(), "ĠĠ".into()));
        assert!(split_merge("abc").is_err());
    }
}
