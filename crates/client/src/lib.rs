//! The insitu client library.
pub mod rpc;
