//! Streaming decode never yields broken UTF-8 and concatenates to the one-shot decode.

use crate::common::{model, MODELS};

const TEXTS: &[&str] = &[
    "我们今天去公园散步，天气非常好。人工智能正在改变世界。",
    "日本語のテキストとカタカナ、ひらがな。東京タワー",
    "Family: 👨\u{200d}👩\u{200d}👧\u{200d}👦, flags 🇫🇷🇯🇵, skin tone 👍🏽, heart ❤️, rocket 🚀!",
    "안녕하세요 مرحبا Ångström Dvořák 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑∫√",
    "<|im_start|>assistant\n好的😀<|im_end|>",
];

#[test]
fn stream_decode_yields_whole_characters() {
    for (key, _) in MODELS {
        let Some(tok) = model(key) else { continue };
        for text in TEXTS {
            let ids = tok.encode(text, false, true).expect("encode");
            for skip_special in [false, true] {
                let mut dec = tok.stream_decoder(skip_special);
                let mut out = String::new();
                let mut held_back = 0;
                for &id in &ids {
                    let piece = dec.push(id);
                    // A String is valid UTF-8 by construction; check no replacement chars leak.
                    assert!(
                        !piece.contains('\u{fffd}'),
                        "{key}: broken char in {piece:?}"
                    );
                    if piece.is_empty() && dec.has_pending() {
                        held_back += 1;
                    }
                    out.push_str(&piece);
                }
                out.push_str(&dec.finish());
                assert_eq!(out, tok.decode(&ids, skip_special), "{key}: {text}");
                if !skip_special {
                    assert_eq!(&out, text);
                }
                // Byte-level BPE splits some of these characters across tokens.
                if text.contains('🇫') {
                    assert!(
                        held_back > 0,
                        "{key}: expected a held-back partial character"
                    );
                }
            }
        }
    }
}

#[test]
fn stream_decode_of_truncated_character_flushes_replacement() {
    for (key, _) in MODELS {
        let Some(tok) = model(key) else { continue };
        let ids = tok.encode("🚀", false, false).unwrap();
        // Find a split token: feeding all but the last id leaves bytes pending.
        if ids.len() < 2 {
            continue;
        }
        let mut dec = tok.stream_decoder(false);
        let mut out = String::new();
        for &id in &ids[..ids.len() - 1] {
            out.push_str(&dec.push(id));
        }
        assert!(out.is_empty() && dec.has_pending(), "{key}");
        assert_eq!(dec.finish(), "\u{fffd}");
    }
}
