pub mod bench;
pub mod chat;
pub mod info;
pub mod logits;
pub mod run;
pub mod scenarios;
pub mod serve;
pub mod tokens;
