//! Parameter defaults, serde and validation.

use kestrel_sampler::{Sampler, SamplerError, SamplingParams};

#[test]
fn defaults_match_llama_cpp() {
    let p = SamplingParams::default();
    assert_eq!(p.temperature, 0.8);
    assert_eq!(p.top_k, 40);
    assert_eq!(p.top_p, 0.95);
    assert_eq!(p.min_p, 0.05);
    assert_eq!(p.repeat_penalty, 1.0);
    assert_eq!(p.repeat_last_n, 64);
    assert_eq!(p.presence_penalty, 0.0);
    assert_eq!(p.frequency_penalty, 0.0);
    assert_eq!(p.seed, None);
    assert!(p.validate().is_ok());
    assert!(!p.is_greedy());
    assert!(SamplingParams::greedy().is_greedy());
    assert!(SamplingParams::greedy().validate().is_ok());
}

#[test]
fn serde_fills_missing_fields_with_defaults_and_round_trips() {
    let p: SamplingParams =
        serde_json::from_str(r#"{"temperature": 0.2, "seed": 7}"#).expect("parse");
    assert_eq!(p.temperature, 0.2);
    assert_eq!(p.seed, Some(7));
    assert_eq!(p.top_k, 40);
    let back: SamplingParams =
        serde_json::from_str(&serde_json::to_string(&p).expect("ser")).expect("de");
    assert_eq!(back, p);
}

fn err_param(p: SamplingParams) -> &'static str {
    match p.validate() {
        Err(SamplerError::InvalidParam { param, .. }) => param,
        Ok(()) => panic!("expected an error for {p:?}"),
    }
}

#[test]
fn validation_rejects_out_of_range_values() {
    let d = SamplingParams::default;
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                temperature: -0.1,
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::NAN,
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::INFINITY,
                ..d()
            },
            "temperature",
        ),
        (SamplingParams { top_p: 0.0, ..d() }, "top_p"),
        (SamplingParams { top_p: 1.01, ..d() }, "top_p"),
        (
            SamplingParams {
                top_p: f32::NAN,
                ..d()
            },
            "top_p",
        ),
        (
            SamplingParams {
                min_p: -0.01,
                ..d()
            },
            "min_p",
        ),
        (SamplingParams { min_p: 1.5, ..d() }, "min_p"),
        (
            SamplingParams {
                repeat_penalty: 0.0,
                ..d()
            },
            "repeat_penalty",
        ),
        (
            SamplingParams {
                repeat_penalty: -1.0,
                ..d()
            },
            "repeat_penalty",
        ),
        (
            SamplingParams {
                repeat_last_n: -2,
                ..d()
            },
            "repeat_last_n",
        ),
        (
            SamplingParams {
                presence_penalty: 2.5,
                ..d()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: -3.0,
                ..d()
            },
            "frequency_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: f32::NAN,
                ..d()
            },
            "frequency_penalty",
        ),
    ];
    for (p, want) in cases {
        assert_eq!(err_param(p), want);
    }
    // Edges that are allowed.
    for p in [
        SamplingParams {
            temperature: 0.0,
            ..d()
        },
        SamplingParams { top_p: 1.0, ..d() },
        SamplingParams { min_p: 0.0, ..d() },
        SamplingParams { min_p: 1.0, ..d() },
        SamplingParams {
            repeat_last_n: -1,
            ..d()
        },
        SamplingParams {
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            ..d()
        },
    ] {
        assert!(p.validate().is_ok(), "{p:?}");
    }
}

#[test]
fn error_message_is_clear_and_sampler_new_validates() {
    let p = SamplingParams {
        top_p: 1.5,
        ..SamplingParams::default()
    };
    let msg = p.validate().unwrap_err().to_string();
    assert_eq!(
        msg,
        "invalid sampling parameter `top_p` = 1.5: must be in (0, 1] (1 = disabled)"
    );
    assert!(Sampler::new(p, 10).is_err());
}
