//! Streaming detokenization. A token may end in the middle of a UTF-8 character (byte-level BPE
//! splits CJK and emoji across tokens), so bytes are held back until the character completes.

use crate::Tokenizer;

/// Turns a byte stream into text, never splitting a character. Invalid bytes become U+FFFD
/// exactly as `String::from_utf8_lossy` would replace them in the whole stream, so the yields
/// concatenate to the one-shot decode.
#[derive(Debug, Default, Clone)]
pub struct Utf8Buffer {
    pending: Vec<u8>,
}

impl Utf8Buffer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add bytes; return the text that is now complete (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid_end = start + e.valid_up_to();
                    // Safe: from_utf8 just validated this range.
                    out.push_str(
                        std::str::from_utf8(&self.pending[start..valid_end]).unwrap_or(""),
                    );
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            start = valid_end;
                            break;
                        }
                        Some(n) => {
                            out.push('\u{fffd}');
                            start = valid_end + n;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Bytes held back so far.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Flush what is left; an unfinished character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// Decodes one token id at a time, yielding only complete UTF-8 text.
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special: bool,
    buffer: Utf8Buffer,
    scratch: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            buffer: Utf8Buffer::new(),
            scratch: Vec::new(),
        }
    }

    /// Feed one id; returns the text completed by it (empty while a character is unfinished).
    pub fn push(&mut self, id: u32) -> String {
        self.scratch.clear();
        self.tokenizer
            .append_piece(id, self.skip_special, &mut self.scratch);
        self.buffer.push(&self.scratch)
    }

    /// Whether bytes are held back waiting for the rest of a character.
    pub fn has_pending(&self) -> bool {
        !self.buffer.pending().is_empty()
    }

    /// End of stream: flush held-back bytes (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        self.buffer.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::Utf8Buffer;

    #[test]
    fn holds_back_partial_characters() {
        let text = "a中😀b";
        let bytes = text.as_bytes();
        let mut buf = Utf8Buffer::new();
        let mut out = String::new();
        for b in bytes {
            let piece = buf.push(std::slice::from_ref(b));
            out.push_str(&piece);
        }
        out.push_str(&buf.finish());
        assert_eq!(out, text);
    }

    #[test]
    fn invalid_bytes_match_lossy_decode() {
        let bytes = [b'x', 0xE4, b'y', 0xFF, 0xF0, 0x9F];
        let mut buf = Utf8Buffer::new();
        let mut out = String::new();
        for b in bytes {
            out.push_str(&buf.push(&[b]));
        }
        out.push_str(&buf.finish());
        assert_eq!(out, String::from_utf8_lossy(&bytes));
    }
}
