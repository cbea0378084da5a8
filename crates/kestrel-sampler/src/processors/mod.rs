//! The processors of the sampling chain, each usable on its own.
//!
//! Filters ([`TopK`], [`TopP`], [`MinP`]) and transforms ([`Penalties`],
//! [`Temperature`]) edit a [`crate::Candidates`] list in place; the final
//! pick is [`greedy::argmax`] or [`dist::sample`].

pub mod dist;
pub mod greedy;
pub mod min_p;
pub mod penalties;
pub mod temperature;
pub mod top_k;
pub mod top_p;

pub use min_p::MinP;
pub use penalties::Penalties;
pub use temperature::Temperature;
pub use top_k::TopK;
pub use top_p::TopP;
