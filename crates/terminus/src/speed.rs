//! `terminus speed`: ops/s of every batchable handshake operation, scalar (aws-lc) and
//! in full 8-lane crypto_mb batches, and the crossover batch size, like `openssl speed`.

use std::io::Write;
use std::time::Duration;

use terminus_engine::cost::{crossover_label, Cost, Operation, Workload};
use terminus_engine::multibuffer;
use terminus_engine::speed::throughput;

pub struct SpeedArgs {
    pub ops: Vec<String>,
    pub seconds: f64,
    pub multi: usize,
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
