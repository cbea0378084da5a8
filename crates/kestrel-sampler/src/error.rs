//! Errors reported by the sampler.

use thiserror::Error;

/// An invalid sampling parameter.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SamplerError {
    /// A parameter is outside its allowed range.
    #[error("invalid sampling parameter `{param}` = {value}: {expected}")]
    InvalidParam {
        /// The parameter's name, as in [`crate::SamplingParams`].
        param: &'static str,
        /// The offending value, formatted.
        value: String,
        /// What is allowed.
        expected: &'static str,
    },
}

impl SamplerError {
    pub(crate) fn invalid(
        param: &'static str,
        value: impl std::fmt::Display,
        expected: &'static str,
    ) -> Self {
        SamplerError::InvalidParam {
            param,
            value: value.to_string(),
            expected,
        }
    }
}
