//! Message bodies both ways: [`RequestBody`] pulled by the responder, [`Body`] pulled by
//! the connection as the client takes it. Neither is ever held whole unless it is small
//! and already in memory.

pub mod budget;
mod request;
mod response;

pub use request::RequestBody;
pub(crate) use request::{Feed, Piece};
pub use response::Body;
