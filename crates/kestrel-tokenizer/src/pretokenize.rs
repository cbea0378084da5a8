//! Pre-tokenizer split regexes, chosen by `tokenizer.ggml.pre` exactly as llama.cpp's
//! `llama-vocab.cpp` does. Several regexes are applied in turn, each splitting the pieces left by
//! the one before while keeping unmatched text as pieces of its own (HF `Split`, `Isolated`).

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::TokenizerError;

/// GPT-2's regex. llama.cpp lists it without the trailing `|\s+`, but splits it with a hand-written
/// matcher that has that fallback, so the regex spelled out here includes it.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[nN][tT]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Like LLAMA3 but single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[nN][tT]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5 (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN35`): QWEN2's split (without `'nt`, as
/// llama.cpp spells it) where combining marks `\p{M}` join the letters of a word and stay out
/// of punctuation runs, so a word with accents or an Indic/Arabic vowel sign is one piece.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer families llama.cpp distinguishes (those we support).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    Default,
    Llama3,
    Qwen2,
    Qwen35,
    Gpt2,
    /// StarCoder family (smollm, starcoder, refact, command-r, ...): digits split one by one.
    StarCoder,
    Falcon,
    Gpt4o,
}

impl PreTokenizer {
    /// Map a `tokenizer.ggml.pre` value to its family, as llama.cpp's vocab loader does.
    pub fn from_gguf_name(name: &str) -> Result<Self, TokenizerError> {
        Ok(match name {
            "default" => Self::Default,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "dbrx" | "smaug-bpe" => Self::Llama3,
            "qwen2" | "qwen2.5" | "qwen-2.5" | "deepseek-r1-qwen" | "megrez" | "kormo" => {
                Self::Qwen2
            }
            "qwen35" => Self::Qwen35,
            "gpt-2" | "gpt2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v1-en"
            | "jina-v2-es" | "jina-v2-de" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo"
            | "jais" | "trillion" | "a.x-4.0" | "mellum" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => Self::StarCoder,
            "falcon" => Self::Falcon,
            "gpt-4o" | "llama4" => Self::Gpt4o,
            other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
        })
    }

    /// Short name for display.
    pub fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Llama3 => "llama3",
            Self::Qwen2 => "qwen2",
            Self::Qwen35 => "qwen35",
            Self::Gpt2 => "gpt2",
            Self::StarCoder => "starcoder",
            Self::Falcon => "falcon",
            Self::Gpt4o => "gpt-4o",
        }
    }

    /// llama.cpp emits a word whole when it is in the vocabulary, skipping merges (llama3 only).
    pub fn ignore_merges(self) -> bool {
        self == Self::Llama3
    }

    /// The regexes, applied in order.
    pub fn regexes(self) -> Vec<&'static str> {
        match self {
            Self::Default => vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            Self::Llama3 => vec![LLAMA3],
            Self::Qwen2 => vec![QWEN2],
            Self::Qwen35 => vec![QWEN35],
            Self::Gpt2 => vec![GPT2],
            Self::StarCoder => vec![r"\p{N}", GPT2],
            Self::Falcon => vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
            Self::Gpt4o => vec![GPT4O],
        }
    }

    /// The HF pre-tokenizer: the splits, then the byte-level mapping (no regex of its own).
    pub(crate) fn build(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
        for re in self.regexes() {
            let split = Split::new(
                SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TokenizerError::Build(format!("pre-tokenizer regex {re:?}: {e}")))?;
            steps.push(split.into());
        }
        steps.push(ByteLevel::new(false, false, false).into());
        Ok(Sequence::new(steps).into())
    }
}

#[cfg(test)]
mod tests {
    use super::PreTokenizer;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer as _};

    /// The pieces of `text` after the split regexes (before the byte-level mapping).
    fn pieces(pre: PreTokenizer, text: &str) -> Vec<String> {
        let mut out = vec![text.to_string()];
        for re in pre.regexes() {
            let split = tokenizers::pre_tokenizers::split::Split::new(
                tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_string()),
                tokenizers::SplitDelimiterBehavior::Isolated,
                false,
            )
            .unwrap();
            let mut next = Vec::new();
            for piece in &out {
                let mut s = PreTokenizedString::from(piece.as_str());
                split.pre_tokenize(&mut s).unwrap();
                next.extend(
                    s.get_splits(OffsetReferential::Original, OffsetType::Byte)
                        .into_iter()
                        .map(|(p, _, _)| p.to_string()),
                );
            }
            out = next;
        }
        out
    }

    #[test]
    fn qwen35_keeps_combining_marks_with_their_letters() {
        // "é" written as e + U+0301 (a combining acute accent), Hindi with vowel signs (\p{M})
        let text = "cafe\u{301} नमस्ते x=12";
        assert_eq!(
            pieces(PreTokenizer::Qwen35, text),
            ["cafe\u{301}", " नमस्ते", " x", "=", "1", "2"]
        );
        // qwen2's split cuts the words at their marks
        let q2 = pieces(PreTokenizer::Qwen2, text);
        assert!(q2.contains(&"cafe".to_string()), "{q2:?}");
        assert_eq!(
            PreTokenizer::from_gguf_name("qwen35").unwrap(),
            PreTokenizer::Qwen35
        );
    }
}
