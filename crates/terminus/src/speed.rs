//! `terminus speed`: ops/s of every batchable handshake operation, scalar (aws-lc) and
//! in full 8-lane crypto_mb batches, and the crossover batch size, like `openssl speed`.

use std::io::Write;
use std::time::Duration;

use terminus_engine::cost::{crossover_label, Cost, Operation, Workload};
use terminus_engine::multibuffer;
use terminus_engine::simd::after_effect::{self, Ratio, Settings};
use terminus_engine::simd::{decide, Inputs};
use terminus_engine::speed::throughput;

pub struct SpeedArgs {
    pub ops: Vec<String>,
    pub seconds: f64,
    pub multi: usize,
    /// Measure the after-effect of batches on scalar code instead ([`frequency`]).
    pub frequency: bool,
}

/// Runs the measurements and prints the table; Err names what was wrong with the input.
pub fn run(args: SpeedArgs) -> Result<(), String> {
    let ops = if args.ops.is_empty() {
        Operation::ALL.to_vec()
    } else {
        args.ops
            .iter()
            .map(|name| {
                Operation::from_name(name).ok_or_else(|| {
                    let known: Vec<&str> = Operation::ALL.iter().map(|op| op.name()).collect();
                    format!("unknown operation {name:?}; known: {}", known.join(" "))
                })
            })
            .collect::<Result<_, _>>()?
    };
    if args.frequency {
        let ops = if args.ops.is_empty() {
            vec![Operation::Rsa2048, Operation::EcdsaP256]
        } else {
            ops
        };
        return frequency(&ops);
    }
    if !(args.seconds > 0.0 && args.seconds <= 600.0) {
        return Err(format!(
            "--seconds {} is out of range; give 0 < S <= 600",
            args.seconds
        ));
    }
    let threads = args.multi.max(1);
    let duration = Duration::from_secs_f64(args.seconds);
    let batched = multibuffer::applicable();
    println!(
        "terminus speed: {}, {} s per measurement; multibuffer: {}",
        if threads == 1 {
            "1 thread".to_owned()
        } else {
            format!("{threads} threads at once")
        },
        args.seconds,
        if batched {
            "crypto_mb, 8 lanes per call (AVX-512 IFMA)"
        } else {
            "not available (this CPU has no AVX-512 IFMA)"
        }
    );
    println!(
        "{:<14} {:<26} {:>12} {:>14} {:>8} {:>10}",
        "op", "one operation is", "scalar/s", "multibuffer/s", "speedup", "crossover"
    );
    for &op in &ops {
        // Key generation (RSA-4096 takes a second or so) is not part of any figure.
        let workload = Workload::generate(op)?;
        let scalar = throughput(&workload, false, duration, threads);
        let (mb, speedup, crossover) = if batched {
            let mb = throughput(&workload, true, duration, threads);
            (
                format!("{mb:.1}"),
                format!("{:.2}x", mb / scalar),
                if op.decided_by() == op {
                    crossover_label(Cost::from_rates(scalar, mb).crossover())
                } else {
                    format!("={}", op.decided_by().name())
                },
            )
        } else {
            ("n/a".into(), "-".into(), "-".into())
        };
        println!(
            "{:<14} {:<26} {:>12.1} {:>14} {:>8} {:>10}",
            op.name(),
            op.describe(),
            scalar,
            mb,
            speedup,
            crossover
        );
        let _ = std::io::stdout().flush();
    }
    println!("crossover: the smallest batch for which one multibuffer call beats computing it scalar; the server measures its own at start-up.");
    if ops.iter().any(|op| op.decided_by() != *op) {
        println!("=x25519: a hybrid's KEM part is computed one by one either way, so its batches pay exactly when its X25519 half's do.");
    }
    Ok(())
}

/// `terminus speed --frequency`: what crypto_mb batches cost scalar code on this core and
/// on a neighbour core (the AVX-512 frequency licence, where the CPU has one), and what
/// `crypto.simd = "auto"` would choose from it.
fn frequency(ops: &[Operation]) -> Result<(), String> {
    if !multibuffer::applicable() {
        println!("terminus speed --frequency: this CPU has no AVX-512 IFMA, so crypto_mb never runs and handshakes use no wide vectors: nothing to measure.");
        let d = decide(&Inputs::measured(false, 0.0, None, false));
        println!(
            "crypto.simd = \"auto\" chooses {}: {}",
            d.placement.name(),
            d.why
        );
        return Ok(());
    }
    let cpus = terminus_sys::configured_cpus();
    terminus_sys::pin_current_thread(0).map_err(|e| format!("pinning to CPU 0: {e}"))?;
    let settings = Settings {
        neighbour: (cpus > 1).then_some(1),
        ..Settings::default()
    };
    println!(
        "terminus speed --frequency: a scalar probe's throughput on CPU 0 right after crypto_mb batches over right after scalar work only{}; median [lowest-highest] of {} rounds (1.000x: no after-effect)",
        if cpus > 1 {
            ", and on CPU 1 while CPU 0 batches"
        } else {
            " (one CPU: no neighbour)"
        },
        settings.rounds
    );
    println!(
        "{:<12} {:>30} {:>30} {:>18}",
        "op", "same core after batches", "neighbour while batching", "AVX512_elapsed_ms"
    );
    let ratio = |r: &Ratio| format!("{:.3}x [{:.3}-{:.3}]", r.median, r.low, r.high);
    let (mut worst, mut worst_neighbour) = (0.0f64, None::<f64>);
    for &op in ops {
        let workload = Workload::generate(op)?;
        let effect = after_effect::measure(&workload, &settings)?;
        worst = worst.max(effect.same_core.loss());
        if let Some(n) = &effect.neighbour {
            worst_neighbour = Some(worst_neighbour.unwrap_or(0.0).max(n.loss()));
        }
        println!(
            "{:<12} {:>30} {:>30} {:>18}",
            op.name(),
            ratio(&effect.same_core),
            effect.neighbour.as_ref().map_or("-".into(), ratio),
            effect
                .avx512_elapsed_ms
                .map_or("n/a".into(), |ms| ms.to_string())
        );
        let _ = std::io::stdout().flush();
    }
    let d = decide(&Inputs::measured(true, worst, worst_neighbour, cpus > 1));
    println!(
        "crypto.simd = \"auto\" would choose {} (with a core free for crypto threads where there is more than one): {}",
        d.placement.name(),
        d.why
    );
    Ok(())
}
