//! Where crypto_mb batches run (`crypto.simd`): on the workers (`inline`), or on crypto
//! threads pinned to cores of their own (`dedicated`), so that worker cores never run
//! AVX-512 for handshakes. `auto` decides from the measured after-effect by [`decide`].
//!
//! The rule, per handshake. Inline, the worker's own scalar work around a handshake (its
//! ClientHello and record handling, the HTTP it then serves) runs after batches and
//! loses the measured after-effect `A` of it: `A x worker_us`. Dedicated, that loss is
//! gone, and each operation pays instead a hand-off to another core and back
//! (`handoff_us`). `auto` picks `dedicated` when all of these hold:
//! - the CPU runs crypto_mb (otherwise no wide vectors run for handshakes at all);
//! - `A` is above [`NOISE_FLOOR`] (5%: the measurement's spread on a machine without a
//!   licence is a few percent, and below it there is nothing to shield);
//! - `A x worker_us > handoff_us`: with the defaults (120 µs of worker scalar work per
//!   handshake, from bench/report's ECDSA handshake at 157 µs with 37 µs of it crypto;
//!   2 µs per operation handed off), any `A` above 1.7% pays, so the noise floor decides;
//! - a core is free for the crypto threads (the workers do not use every core);
//! - a neighbour core loses less than half as much as the batching core: where the
//!   licence is shared (one clock domain), a dedicated core would not shield the workers.
//!
//! Otherwise `inline`. The measurement is the mechanism ([`super::after_effect`]); this
//! module only weighs it.

/// `crypto.simd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Decided at start-up from the measurement ([`decide`]).
    Auto,
    /// Batches run on the workers.
    Inline,
    /// Batches run on crypto threads pinned to cores of their own.
    Dedicated,
}

impl Placement {
    /// Every placement, in the order the config lists them.
    pub const ALL: [Placement; 3] = [Placement::Auto, Placement::Inline, Placement::Dedicated];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Auto => "auto",
            Placement::Inline => "inline",
            Placement::Dedicated => "dedicated",
        }
    }

    /// The placement the configuration `name` means.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Below this share of scalar throughput lost, there is no after-effect to shield.
pub const NOISE_FLOOR: f64 = 0.05;
/// A worker's scalar work per handshake, µs, where nothing better is known.
pub const WORKER_US: f64 = 120.0;
/// One operation handed to another core and its answer back, µs, where not measured.
pub const HANDOFF_US: f64 = 2.0;

/// What [`decide`] weighs.
#[derive(Debug, Clone, Copy)]
pub struct Inputs {
    /// Whether crypto_mb runs on this CPU.
    pub multibuffer: bool,
    /// Share of scalar throughput lost on the batching core right after batches.
    pub after_effect: f64,
    /// The same on a neighbour core while batches run; `None` where not measured.
    pub neighbour: Option<f64>,
    /// Whether a core is free for crypto threads.
    pub spare_core: bool,
    /// The worker's scalar work per handshake, µs.
    pub worker_us: f64,
    /// One operation's hand-off to another core and back, µs.
    pub handoff_us: f64,
}

impl Inputs {
    /// The measured losses, with the default costs.
    pub fn measured(
        multibuffer: bool,
        after_effect: f64,
        neighbour: Option<f64>,
        spare_core: bool,
    ) -> Self {
        Self {
            multibuffer,
            after_effect,
            neighbour,
            spare_core,
            worker_us: WORKER_US,
            handoff_us: HANDOFF_US,
        }
    }
}

/// A placement and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// `Inline` or `Dedicated`.
    pub placement: Placement,
    /// One line for the log and `terminus speed --frequency`.
    pub why: String,
}

/// What `auto` means with `inputs` (see the module documentation for the rule).
pub fn decide(inputs: &Inputs) -> Decision {
    let inline = |why: String| Decision {
        placement: Placement::Inline,
        why,
    };
    let a = inputs.after_effect;
    if !inputs.multibuffer {
        return inline("crypto_mb does not run on this CPU: no wide vectors for handshakes".into());
    }
    if a <= NOISE_FLOOR {
        return inline(format!(
            "after-effect {:.1}% is within the {:.0}% noise floor: nothing to shield the workers from",
            a * 100.0,
            NOISE_FLOOR * 100.0
        ));
    }
    let lost = a * inputs.worker_us;
    if lost <= inputs.handoff_us {
        return inline(format!(
            "after-effect {:.1}% costs {lost:.1} µs of worker work per handshake, less than handing it off ({:.1} µs)",
            a * 100.0,
            inputs.handoff_us
        ));
    }
    if !inputs.spare_core {
        return inline(format!(
            "after-effect {:.1}%, but every core runs a worker: no core to dedicate",
            a * 100.0
        ));
    }
    if let Some(n) = inputs.neighbour.filter(|&n| n >= a / 2.0) {
        return inline(format!(
            "after-effect {:.1}%, and a neighbour core loses {:.1}% too: a dedicated core would not shield the workers",
            a * 100.0,
            n * 100.0
        ));
    }
    Decision {
        placement: Placement::Dedicated,
        why: format!(
            "after-effect {:.1}% costs {lost:.1} µs of worker work per handshake, more than handing it off ({:.1} µs)",
            a * 100.0,
            inputs.handoff_us
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(after_effect: f64, neighbour: Option<f64>, spare_core: bool) -> Placement {
        decide(&Inputs::measured(true, after_effect, neighbour, spare_core)).placement
    }

    #[test]
    fn a_machine_with_a_fifteen_percent_after_effect_dedicates_a_core() {
        assert_eq!(placed(0.15, Some(0.01), true), Placement::Dedicated);
        assert_eq!(placed(0.15, None, true), Placement::Dedicated);
    }

    #[test]
    fn a_machine_without_an_after_effect_batches_inline() {
        assert_eq!(placed(0.0, Some(0.0), true), Placement::Inline);
        // Within the noise floor.
        assert_eq!(placed(0.04, Some(0.0), true), Placement::Inline);
    }

    #[test]
    fn dedicating_needs_a_free_core_and_a_neighbour_spared() {
        assert_eq!(placed(0.15, Some(0.0), false), Placement::Inline);
        // One clock domain: the neighbour loses as much.
        assert_eq!(placed(0.15, Some(0.12), true), Placement::Inline);
        assert_eq!(placed(0.15, Some(0.07), true), Placement::Dedicated);
    }

    #[test]
    fn the_after_effect_must_outweigh_the_hand_off() {
        let mut inputs = Inputs::measured(true, 0.15, None, true);
        inputs.handoff_us = 20.0;
        // 15% of 120 µs is 18 µs: less than a 20 µs hand-off.
        assert_eq!(decide(&inputs).placement, Placement::Inline);
        inputs.worker_us = 200.0;
        assert_eq!(decide(&inputs).placement, Placement::Dedicated);
    }

    #[test]
    fn without_crypto_mb_nothing_is_moved() {
        let d = decide(&Inputs::measured(false, 0.5, None, true));
        assert_eq!(d.placement, Placement::Inline);
        assert!(d.why.contains("crypto_mb does not run"), "{}", d.why);
    }

    #[test]
    fn placements_round_trip_their_config_names() {
        for p in Placement::ALL {
            assert_eq!(Placement::from_name(p.name()), Some(p));
        }
        assert_eq!(Placement::from_name("sometimes"), None);
    }
}
