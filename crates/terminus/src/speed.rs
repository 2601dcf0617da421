//! `terminus speed`: ops/s of every batchable handshake operation, scalar (aws-lc) and
//! in full 8-lane crypto_mb batches, and the crossover batch size, like `openssl speed`.

use std::error::Error;
use std::io::Write;
use std::time::Duration;

use terminus_capacity::simd::after_effect::{self, Settings};
use terminus_capacity::simd::{decide, Inputs};
use terminus_capacity::speed::throughput;
use terminus_engine::cost::{crossover_label, Cost, Operation, Workload};
use terminus_engine::multibuffer;

pub struct SpeedArgs {
    pub ops: Vec<String>,
    pub seconds: f64,
    pub multi: usize,
    /// Measure the after-effect of batches on scalar code instead ([`frequency`]).
    pub frequency: bool,
}

/// Runs the measurements and prints the table; Err names what was wrong with the input.
pub fn run(args: SpeedArgs) -> Result<(), Box<dyn Error>> {
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
        )
        .into());
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
fn frequency(ops: &[Operation]) -> Result<(), Box<dyn Error>> {
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
    let allowed = terminus_sys::allowed_cpus().map_err(|e| format!("sched_getaffinity: {e}"))?;
    let this = allowed[0];
    let settings = Settings {
        neighbour: after_effect::neighbour_of(this, &allowed),
        ..Settings::default()
    };
    println!(
        "terminus speed --frequency: a scalar probe's throughput on CPU {this} right after crypto_mb batches over right after scalar work only{}; median [lowest-highest] of {} rounds (1.000x: no after-effect)",
        match settings.neighbour {
            Some(n) => format!(", and on CPU {n} while CPU {this} batches"),
            None => " (no other core allowed that is not this one's SMT sibling: no neighbour)".into(),
        },
        settings.rounds
    );
    println!(
        "{:<12} {:>30} {:>30} {:>18}",
        "op", "same core after batches", "neighbour while batching", "AVX512_elapsed_ms"
    );
    // The op whose batches cost the most decides, its neighbour figure with it.
    let mut worst: Option<(f64, Option<f64>)> = None;
    for &op in ops {
        let workload = Workload::generate(op)?;
        let effect = after_effect::measure_on(this, &workload, &settings)?;
        let loss = effect.same_core.loss();
        if worst.is_none_or(|(w, _)| loss > w) {
            worst = Some((loss, effect.neighbour_loss()));
        }
        println!(
            "{:<12} {:>30} {:>30} {:>18}",
            op.name(),
            effect.same_core.to_string(),
            match &effect.neighbour {
                None => "-".into(),
                Some(Ok(r)) => r.to_string(),
                Some(Err(_)) => "could not run".into(),
            },
            effect
                .avx512_elapsed_ms
                .map_or("n/a".into(), |ms| ms.to_string())
        );
        if let Some(Err(e)) = &effect.neighbour {
            println!("  ({e})");
        }
        let _ = std::io::stdout().flush();
    }
    let (loss, neighbour) = worst.unwrap_or((0.0, None));
    let spare_core = allowed.len() > 1;
    let d = decide(&Inputs::measured(true, loss, neighbour, spare_core));
    println!(
        "crypto.simd = \"auto\" would choose {} (with a core free for crypto threads where this process may use more than one): {}",
        d.placement.name(),
        d.why
    );
    Ok(())
}
