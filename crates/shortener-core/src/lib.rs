//! Pure logic of the URL shortener: everything that decides, nothing that waits.
//!
//! This crate holds the rules a link must obey (codes, aliases, destination URLs), the link
//! model, the traits every store implements, and the day arithmetic of analytics. It does no
//! I/O and owns no async runtime: the `shortener` binary brings both.
//!
//! ```
//! use shortener_core::code::{CodePermutation, encode_id};
//!
//! let permutation = CodePermutation::new([7; 16]);
//! let code = encode_id(permutation.permute(42)).unwrap();
//! assert_eq!(code.len(), 7);
//! assert!(code.bytes().all(|b| b.is_ascii_alphanumeric()));
//! ```

pub mod alias;
pub mod altcha;
pub mod audit;
pub mod code;
pub mod day;
pub mod hll;
pub mod link;
pub mod listing;
pub mod long_url;
pub mod people;
pub mod report;
pub mod store;
pub mod threat;
pub mod token;
