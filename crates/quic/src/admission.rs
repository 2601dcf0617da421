//! Which new QUIC connections are taken, made to prove their address first (Retry), or
//! refused: admission control's QUIC half, policy without I/O.
//!
//! A QUIC Initial costs the server a handshake (a signature, a key exchange, a coroutine
//! stack while it waits) for one datagram whose source address may be forged. Retry
//! (RFC 9000 section 8.1) costs the server only a token and the client a round trip,
//! and proves the address before any handshake work; quic-go (and so Caddy) sends it
//! only when too many handshakes are in flight, nginx only when told to
//! (`quic_retry on`). terminus does as quic-go by default: Retry above half the limit of
//! handshakes in flight per worker, and refuse (CONNECTION_REFUSED) at the limit, so a
//! flood of Initials cannot take every coroutine stack or the engine's whole capacity.

/// When new connections are made to Retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Every connection whose address is not yet validated.
    Always,
    /// Never: every connection is taken (up to the limit).
    Never,
    /// When this many handshakes or more are in flight on the worker.
    Above(usize),
}

/// `[http3]`'s limits, per worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// When to Retry.
    pub retry: Retry,
    /// Handshakes in flight at most; a new connection beyond is refused.
    pub max_handshakes: usize,
    /// How long a handshake may take (`timeouts.handshake`, as TCP's): past it the
    /// connection is closed and its place freed.
    pub handshake_timeout: std::time::Duration,
}

impl Limits {
    /// The default limit of handshakes in flight per worker.
    pub const MAX_HANDSHAKES: usize = 1024;
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            retry: Retry::Above(Self::MAX_HANDSHAKES / 2),
            max_handshakes: Self::MAX_HANDSHAKES,
            handshake_timeout: std::time::Duration::from_secs(10),
        }
    }
}

/// What to do with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Accept,
    Retry,
    Refuse,
}

/// The decision for a new connection, with `in_flight` handshakes on the worker; its
/// address `validated` (by our Retry's token, or a NEW_TOKEN one) or not. A client that
/// already retried has a validated address: quinn-proto opens no connection for an
/// invalid Retry token, and guarantees that an unvalidated one may still be asked to
/// retry (`Incoming::may_retry`), so there is no third state to decide.
pub(crate) fn decide(limits: &Limits, in_flight: usize, validated: bool) -> Decision {
    if in_flight >= limits.max_handshakes {
        return Decision::Refuse;
    }
    let wants_retry = match limits.retry {
        Retry::Always => true,
        Retry::Never => false,
        Retry::Above(n) => in_flight >= n,
    };
    if wants_retry && !validated {
        Decision::Retry
    } else {
        Decision::Accept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_above_the_threshold_refuse_at_the_limit_and_a_validated_address_is_taken() {
        let limits = Limits {
            retry: Retry::Above(2),
            max_handshakes: 4,
            ..Limits::default()
        };
        assert_eq!(decide(&limits, 0, false), Decision::Accept);
        assert_eq!(decide(&limits, 1, false), Decision::Accept);
        assert_eq!(decide(&limits, 2, false), Decision::Retry);
        // Proven by a token (it retried, or came back with a NEW_TOKEN one): taken,
        // though the worker is busy, and never asked to retry again.
        assert_eq!(decide(&limits, 3, true), Decision::Accept);
        // At the limit, even a proven address is refused.
        assert_eq!(decide(&limits, 4, true), Decision::Refuse);
        assert_eq!(decide(&limits, 4, false), Decision::Refuse);
        let always = Limits {
            retry: Retry::Always,
            ..limits
        };
        assert_eq!(decide(&always, 0, false), Decision::Retry);
        assert_eq!(decide(&always, 0, true), Decision::Accept);
        let never = Limits {
            retry: Retry::Never,
            ..limits
        };
        assert_eq!(decide(&never, 3, false), Decision::Accept);
    }
}
