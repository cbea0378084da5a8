//! Integration tests, compiled as one binary (one link on a 2-core machine).
//!
//! Real-model tests skip with a printed note when a model file is missing, unless
//! `KESTREL_REQUIRE_MODELS=1`, in which case they fail.

mod common;
mod llamacpp_chat;
mod llamacpp_generate;
mod llamacpp_tokenize;
mod stream;
mod tiny;
