//! The vocabulary table shared by both loaders: token texts, llama.cpp token types, decoded byte
//! pieces, named special tokens, the end-of-generation set, and the special-token partition.

use std::collections::{BTreeSet, HashMap};

use crate::bytelevel;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    pub fn from_gguf(v: i64) -> Self {
        match v {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// Ids of the named special tokens; `None` where the model has none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

impl SpecialIds {
    pub fn named(&self) -> Vec<(&'static str, u32)> {
        [
            ("bos", self.bos),
            ("eos", self.eos),
            ("eot", self.eot),
            ("eom", self.eom),
            ("pad", self.pad),
            ("unk", self.unk),
            ("fim_pre", self.fim_pre),
            ("fim_suf", self.fim_suf),
            ("fim_mid", self.fim_mid),
            ("fim_pad", self.fim_pad),
            ("fim_rep", self.fim_rep),
            ("fim_sep", self.fim_sep),
        ]
        .into_iter()
        .filter_map(|(name, id)| id.map(|id| (name, id)))
        .collect()
    }
}

// Texts llama.cpp recognises when the GGUF does not name these tokens (llama-vocab.cpp). It keys
// these on token text because converters do not record them; we follow it to stop where it stops.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>", "<fim-sep>", "<SEP>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// One piece of input text after special tokens are cut out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Token(u32),
    Text(&'a str),
}

pub(crate) struct Vocab {
    pub texts: Vec<String>,
    pub types: Vec<TokenType>,
    /// Bytes each token stands for: byte-level decoded for normal tokens, the text itself for
    /// control / user-defined ones.
    pub pieces: Vec<Box<[u8]>>,
    pub text_to_id: HashMap<String, u32>,
    /// Tokens matched in raw text (control, user-defined, unknown), longest first, as llama.cpp's
    /// `cache_special_tokens`.
    partition_order: Vec<u32>,
}

impl Vocab {
    /// `byte_level`: whether normal token texts are in GPT-2's byte alphabet (else used as is).
    pub fn new(texts: Vec<String>, types: Vec<TokenType>, byte_level: bool) -> Self {
        let mut text_to_id = HashMap::with_capacity(texts.len());
        for (id, t) in texts.iter().enumerate() {
            // Later duplicates win, as in llama.cpp's `token_to_id`.
            text_to_id.insert(t.clone(), id as u32);
        }
        let mut vocab = Self {
            pieces: Vec::new(),
            text_to_id,
            partition_order: Vec::new(),
            texts,
            types,
        };
        vocab.rebuild(byte_level);
        vocab
    }

    fn rebuild(&mut self, byte_level: bool) {
        self.pieces = self
            .texts
            .iter()
            .zip(&self.types)
            .map(|(text, ty)| {
                let mut out = Vec::with_capacity(text.len());
                match ty {
                    TokenType::Normal | TokenType::Byte | TokenType::Undefined
                        if byte_level && bytelevel::is_byte_level(text) =>
                    {
                        bytelevel::decode_token(text, &mut out)
                    }
                    _ => out.extend_from_slice(text.as_bytes()),
                }
                out.into_boxed_slice()
            })
            .collect();
        let mut order: Vec<u32> = (0..self.texts.len() as u32)
            .filter(|&id| {
                matches!(
                    self.types[id as usize],
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                ) && !self.texts[id as usize].is_empty()
            })
            .collect();
        order.sort_by_key(|&id| std::cmp::Reverse(self.texts[id as usize].len()));
        self.partition_order = order;
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn ty(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    fn find_first(&self, candidates: &[&str]) -> Option<u32> {
        candidates
            .iter()
            .find_map(|t| self.text_to_id.get(*t).copied())
    }

    /// Fill in what the metadata left unnamed and compute the end-of-generation set, as
    /// llama.cpp's vocab loader does. Tokens it treats as end-of-turn become control tokens.
    pub fn resolve_specials(
        &mut self,
        mut ids: SpecialIds,
        byte_level: bool,
    ) -> (SpecialIds, Vec<u32>) {
        let fill = |slot: &mut Option<u32>, texts: &[&str]| {
            if slot.is_none() {
                *slot = self.find_first(texts);
            }
        };
        fill(&mut ids.eot, EOT_TEXTS);
        fill(&mut ids.eom, EOM_TEXTS);
        fill(&mut ids.fim_pre, FIM_PRE_TEXTS);
        fill(&mut ids.fim_suf, FIM_SUF_TEXTS);
        fill(&mut ids.fim_mid, FIM_MID_TEXTS);
        fill(&mut ids.fim_pad, FIM_PAD_TEXTS);
        fill(&mut ids.fim_rep, FIM_REP_TEXTS);
        fill(&mut ids.fim_sep, FIM_SEP_TEXTS);

        let mut eog = BTreeSet::new();
        eog.extend(
            [ids.fim_pad, ids.fim_rep, ids.fim_sep]
                .into_iter()
                .flatten(),
        );
        eog.extend(
            EOG_TEXTS
                .iter()
                .filter_map(|t| self.text_to_id.get(*t).copied()),
        );
        eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());

        // llama.cpp overrides these to CONTROL so they are never decoded as text by accident.
        let mut changed = false;
        for &id in &eog {
            let slot = &mut self.types[id as usize];
            if *slot != TokenType::Control && *slot != TokenType::UserDefined {
                *slot = TokenType::Control;
                changed = true;
            }
        }
        if changed {
            self.rebuild(byte_level);
        }
        (ids, eog.into_iter().collect())
    }

    /// Cut special tokens out of `text`, longest token first, as llama.cpp's
    /// `tokenizer_st_partition`. Control and unknown tokens are only recognised when
    /// `parse_special`; user-defined tokens always are (llama.cpp and HF agree on that).
    pub fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut frags = Vec::new();
        if !text.is_empty() {
            frags.push(Fragment::Text(text));
        }
        for &id in &self.partition_order {
            let ty = self.types[id as usize];
            if !parse_special && matches!(ty, TokenType::Control | TokenType::Unknown) {
                continue;
            }
            let needle = self.texts[id as usize].as_str();
            let present = frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)));
            if !present {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Fragment::Text(mut rest) = frag else {
                    next.push(frag);
                    continue;
                };
                while let Some(pos) = rest.find(needle) {
                    if pos > 0 {
                        next.push(Fragment::Text(&rest[..pos]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[pos + needle.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }

    /// Append the bytes of `id` (llama.cpp `token_to_piece`): control and unknown tokens only
    /// when `special`; unused tokens never.
    pub fn append_piece(&self, id: u32, special: bool, out: &mut Vec<u8>) {
        let Some(ty) = self.ty(id) else {
            return;
        };
        let emit = match ty {
            TokenType::Control | TokenType::Unknown => special,
            TokenType::Unused => false,
            _ => true,
        };
        if emit {
            out.extend_from_slice(&self.pieces[id as usize]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> Vocab {
        let texts = ["a", "<s>", "<tool>", "<|x|>"].map(String::from).to_vec();
        let types = vec![
            TokenType::Normal,
            TokenType::Control,
            TokenType::UserDefined,
            TokenType::Control,
        ];
        Vocab::new(texts, types, true)
    }

    #[test]
    fn partition_respects_parse_special() {
        let v = toy();
        let on = v.partition("x<s>y<tool>", true);
        assert_eq!(
            on,
            vec![
                Fragment::Text("x"),
                Fragment::Token(1),
                Fragment::Text("y"),
                Fragment::Token(2)
            ]
        );
        // User-defined tokens are matched even when special parsing is off.
        let off = v.partition("x<s>y<tool>", false);
        assert_eq!(off, vec![Fragment::Text("x<s>y"), Fragment::Token(2)]);
        assert!(v.partition("", true).is_empty());
    }
}
