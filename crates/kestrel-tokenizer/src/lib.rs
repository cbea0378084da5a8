//! kestrel-tokenizer: text ⇄ token ids for the models kestrel runs, plus chat templates.
//!
//! Two sources give the same [`Tokenizer`]: GGUF metadata (`tokenizer.ggml.*`, what llama.cpp
//! reads) and an HF directory (`tokenizer.json` + `tokenizer_config.json`). The parity target is
//! llama.cpp: ids must equal its `/tokenize` output, so the pieces llama.cpp decides itself are
//! done here the way it does them:
//!
//! - pre-tokenizer regexes are picked from `tokenizer.ggml.pre` ([`PreTokenizer`]);
//! - special tokens are cut out of the text first, longest first, control tokens only when
//!   `parse_special` is on, user-defined ones always (`vocab.rs`);
//! - end-of-generation ids and unnamed specials are found by token text as llama.cpp does.
//!
//! The HF `tokenizers` crate does the rest (regex splits, byte-level mapping, BPE merges).
//! Decoding maps tokens to raw bytes ourselves, so [`StreamDecoder`] can hold back a character
//! split across tokens. [`ChatTemplate`] renders HF Jinja templates with minijinja.

mod bytelevel;
mod error;
mod gguf_vocab;
mod hf;
mod pretokenize;
mod stream;
mod template;
mod vocab;

use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::AddedToken;

pub use error::{TemplateError, TokenizerError};
pub use pretokenize::PreTokenizer;
pub use stream::{StreamDecoder, Utf8Buffer};
pub use template::ChatTemplate;
pub use vocab::TokenType;

use gguf_vocab::GgufVocab;
use vocab::{Fragment, SpecialIds, Vocab};

/// A named special token, for display (`kestrel info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    /// Role: "bos", "eos", "eot", "pad", "fim_pre", ...
    pub name: &'static str,
    pub id: u32,
    pub text: String,
}

/// A tokenizer with llama.cpp's special-token rules.
pub struct Tokenizer {
    /// Pre-tokenization and BPE of plain text (special tokens are never matched by it).
    inner: tokenizers::Tokenizer,
    vocab: Vocab,
    specials: SpecialIds,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
    kind: String,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.vocab.len())
            .field("specials", &self.specials)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Build from GGUF metadata. Only `tokenizer.ggml.model = "gpt2"` (byte-level BPE) is
    /// supported, which covers Qwen, SmolLM and Llama 3.
    pub fn from_gguf(header: &kestrel_gguf::Header) -> Result<Self, TokenizerError> {
        let mut g = GgufVocab::from_header(header)?;
        if g.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(g.model));
        }
        // llama.cpp falls back to "default" when the key is missing.
        let pre_name = g.pre.clone().unwrap_or_else(|| "default".to_string());
        let pre = PreTokenizer::from_gguf_name(&pre_name)?;

        for (i, t) in g.tokens.iter_mut().enumerate() {
            if t.is_empty() {
                // As llama.cpp: an empty token would break the vocabulary maps.
                *t = format!("[EMPTY_{i}]");
            }
        }
        let mut vocab = Vocab::new(g.tokens, g.types, true);

        // Merges naming tokens the vocabulary lacks would make the BPE builder fail; llama.cpp
        // never produces such merges' results as tokens, so dropping them changes nothing.
        let merges: Vec<(String, String)> = g
            .merges
            .into_iter()
            .filter(|(a, b)| {
                vocab.text_to_id.contains_key(a)
                    && vocab.text_to_id.contains_key(b)
                    && vocab.text_to_id.contains_key(&format!("{a}{b}"))
            })
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(
                vocab
                    .text_to_id
                    .iter()
                    .map(|(t, &id)| (t.clone(), id))
                    .collect::<tokenizers::models::bpe::Vocab>(),
                merges,
            )
            .ignore_merges(pre.ignore_merges())
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre.build()?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));

        let given = SpecialIds {
            bos: g.bos,
            eos: g.eos,
            eot: g.eot,
            eom: g.eom,
            pad: g.pad,
            unk: g.unk,
            ..SpecialIds::default()
        };
        let (specials, eog) = vocab.resolve_specials(given, true);
        register_added_tokens(&mut inner, &vocab);

        Ok(Self {
            inner,
            vocab,
            specials,
            eog,
            // llama.cpp turns BOS on for llama3-style vocabularies unless the file says otherwise.
            add_bos: g.add_bos.unwrap_or(pre == PreTokenizer::Llama3),
            add_eos: g.add_eos.unwrap_or(false),
            chat_template: g.chat_template,
            kind: format!("gpt2 byte-level BPE (pre: {pre_name})"),
        })
    }

    /// Open a GGUF file and build from its metadata.
    pub fn from_gguf_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let file = kestrel_gguf::GgufFile::open(path)?;
        Self::from_gguf(&file.header)
    }

    /// Build from an HF model directory: `tokenizer.json`, plus `tokenizer_config.json` (chat
    /// template, bos/eos, add_bos_token) and `generation_config.json` (extra eos ids) if present.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        hf::load(dir.as_ref())
    }

    /// Text → ids. `add_special` adds BOS (and EOS) where the model asks for it;
    /// `parse_special` lets control-token texts such as `<|im_start|>` become their ids.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            ids.extend(self.specials.bos);
        }
        for frag in self.vocab.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => ids.push(id),
                Fragment::Text(t) => {
                    let enc = self
                        .inner
                        .encode(t, false)
                        .map_err(|e| TokenizerError::Encode(e.to_string()))?;
                    ids.extend_from_slice(enc.get_ids());
                }
            }
        }
        if add_special && self.add_eos {
            ids.extend(self.specials.eos);
        }
        Ok(ids)
    }

    /// Ids → text. Control tokens are dropped when `skip_special`; invalid UTF-8 becomes U+FFFD.
    /// Unknown ids are skipped.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            self.append_piece(id, skip_special, &mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Raw bytes of one token as decoding produces them (control tokens included).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.vocab.pieces.get(id as usize).map(|p| &p[..])
    }

    /// One token as text, special tokens included (a partial character shows as U+FFFD).
    pub fn token_piece(&self, id: u32) -> Option<String> {
        self.token_bytes(id)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// The token's text as stored in the vocabulary (byte-level alphabet for normal tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// The id of an exact vocabulary text (e.g. `"<|im_end|>"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.text_to_id.get(text).copied()
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.vocab.ty(id)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.specials.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.specials.eos
    }

    pub fn eot(&self) -> Option<u32> {
        self.specials.eot
    }

    pub fn pad(&self) -> Option<u32> {
        self.specials.pad
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Every id that ends generation (eos, eot, `<|im_end|>`, `<|endoftext|>`, FIM pad/repo/sep,
    /// ...), sorted, as llama.cpp determines them.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Control, user-defined and unknown tokens: the ones matched as units in text.
    pub fn is_special(&self, id: u32) -> bool {
        matches!(
            self.vocab.ty(id),
            Some(TokenType::Control | TokenType::UserDefined | TokenType::Unknown)
        )
    }

    /// Short description, e.g. "gpt2 byte-level BPE (pre: qwen2)".
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The named special tokens (bos, eos, eot, pad, fim_*, ...).
    pub fn special_tokens(&self) -> Vec<SpecialToken> {
        self.specials
            .named()
            .into_iter()
            .map(|(name, id)| SpecialToken {
                name,
                id,
                text: self.vocab.texts[id as usize].clone(),
            })
            .collect()
    }

    /// The chat template source shipped with the model, if any.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The model's chat template compiled with its bos/eos texts; `None` if it has none.
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>, TemplateError> {
        let Some(source) = &self.chat_template else {
            return Ok(None);
        };
        let text = |id: Option<u32>| {
            id.and_then(|id| self.token_text(id))
                .unwrap_or_default()
                .to_string()
        };
        ChatTemplate::new(source, &text(self.specials.bos), &text(self.specials.eos)).map(Some)
    }

    /// A streaming decoder borrowing this tokenizer.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    pub(crate) fn append_piece(&self, id: u32, skip_special: bool, out: &mut Vec<u8>) {
        self.vocab.append_piece(id, !skip_special, out);
    }
}

/// Above this many user-defined tokens they are left to `Vocab::partition` alone.
const MAX_REGISTERED_USER_TOKENS: usize = 4096;

/// Register control tokens as special and user-defined ones as plain added tokens, so the inner
/// tokenizer knows them as units; special-token matching itself is done by `Vocab::partition`,
/// so the inner tokenizer is told to treat special-token text as plain text.
fn register_added_tokens(inner: &mut tokenizers::Tokenizer, vocab: &Vocab) {
    let (special, plain): (Vec<AddedToken>, Vec<AddedToken>) = (0..vocab.len() as u32)
        .filter_map(|id| {
            let ty = vocab.ty(id)?;
            let text = &vocab.texts[id as usize];
            match ty {
                TokenType::Control | TokenType::Unknown => {
                    Some(AddedToken::from(text.clone(), true).normalized(false))
                }
                TokenType::UserDefined => {
                    Some(AddedToken::from(text.clone(), false).normalized(false))
                }
                _ => None,
            }
        })
        .partition(|t| t.special);
    inner.add_special_tokens(&special);
    // `Vocab::partition` cuts user-defined tokens out before the inner tokenizer sees the
    // text, so registering them is belt and braces; the inner registration is quadratic in
    // their number (tokenizers' AddedVocabulary), which a vocabulary padded with ~100k
    // user-defined tokens (the random-weight benchmark files) would take minutes over.
    if plain.len() <= MAX_REGISTERED_USER_TOKENS {
        inner.add_tokens(&plain);
    }
    inner.set_encode_special_tokens(true);
}

// A server shares one tokenizer and template across request threads.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Tokenizer>();
    shared::<ChatTemplate>();
};
