//! The server's side of admission: a worker's bound on its handshake work is
//! [`terminus_admission::bound`] (policy, unit-tested there); here are the questions the
//! server asks of it and of the tenants' quotas at the ClientHello ([`quota`]) and for
//! QUIC's handshakes, which a certificate resolver asks ([`quic`]).

pub(crate) mod quic;
pub(crate) mod quota;

pub(crate) use terminus_admission::bound::{Admission, Refusal, Ticket};
