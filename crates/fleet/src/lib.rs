//! What several terminus instances behind one L4 balancer share, so that they behave as
//! one server: the session-ticket keys (a client resumes on whichever instance it
//! reaches).
//!
//! - [`tickets`]: ticket keys by epoch, and the rustls ticketer that seals and opens
//!   tickets with them. Alone, an instance makes its own keys; in a fleet the keys come
//!   from the store.

pub mod tickets;
