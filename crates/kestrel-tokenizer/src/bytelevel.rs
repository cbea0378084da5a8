//! GPT-2 byte-level alphabet: every byte maps to one printable char, so BPE vocabularies can be
//! stored as text. Decoding maps the chars back to raw bytes.

use std::sync::OnceLock;

/// `bytes_to_unicode()` from GPT-2: printable Latin-1 bytes map to themselves, the rest to 256+n.
fn byte_to_char() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next = 256u32;
        for (b, slot) in table.iter_mut().enumerate() {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            let cp = if printable {
                b as u32
            } else {
                next += 1;
                next - 1
            };
            // All code points here are below 0x180, so they are valid chars.
            *slot = char::from_u32(cp).unwrap_or('\u{fffd}');
        }
        table
    })
}

/// Raw bytes of one byte-level token text. Chars outside the alphabet (never produced by the
/// encoder; some vocabularies hold them anyway) are kept as their UTF-8 bytes.
pub(crate) fn decode_token(text: &str, out: &mut Vec<u8>) {
    let table = byte_to_char();
    for ch in text.chars() {
        let cp = ch as u32;
        // The alphabet is {33..=126, 161..=172, 174..=255} ∪ {256..=323}: invert it directly.
        let byte = if cp < 256 && table[cp as usize] == ch {
            Some(cp as u8)
        } else if (256..256 + 68).contains(&cp) {
            table.iter().position(|&c| c == ch).map(|b| b as u8)
        } else {
            None
        };
        match byte {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

/// Whether every char of `text` is in the byte-level alphabet.
pub(crate) fn is_byte_level(text: &str) -> bool {
    let table = byte_to_char();
    text.chars().all(|ch| {
        let cp = ch as u32;
        (cp < 256 && table[cp as usize] == ch) || (256..256 + 68).contains(&cp)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_round_trips_every_byte() {
        let table = byte_to_char();
        for b in 0..=255u8 {
            let mut out = Vec::new();
            decode_token(&table[b as usize].to_string(), &mut out);
            assert_eq!(out, vec![b]);
        }
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
    }
}
