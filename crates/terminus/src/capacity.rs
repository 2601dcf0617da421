//! `terminus capacity`: this machine's crypto capacity in ACU and SCU with a backend, and
//! the ACU cost of every handshake operation (see `terminus_engine::capacity`).

use std::io::Write;
use std::time::Duration;

use terminus_engine::capacity::{scu_per_core, Capacity, CIPHERS};
use terminus_engine::cost::Operation;
use terminus_engine::{multibuffer, BackendKind};

pub struct CapacityArgs {
    pub backend: String,
    pub seconds: f64,
}

/// Measures and prints the table; Err names what was wrong with the input.
pub fn run(args: CapacityArgs) -> Result<(), String> {
    let backend = match args.backend.as_str() {
        "auto" => BackendKind::auto(),
        "scalar" => BackendKind::Scalar,
        "multibuffer" if multibuffer::applicable() => BackendKind::Multibuffer,
        "multibuffer" => {
            return Err("--backend multibuffer: this CPU has no AVX-512 IFMA".into());
        }
        other => {
            return Err(format!(
                "--backend {other:?}: give auto, scalar or multibuffer"
            ))
        }
    };
    if !(args.seconds > 0.0 && args.seconds <= 60.0) {
        return Err(format!(
            "--seconds {} is out of range; give 0 < S <= 60",
            args.seconds
        ));
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "terminus capacity: backend {}, one core measured, {} s per measurement; the machine is {cores} cores of it",
        backend.name(),
        args.seconds
    );
    let capacity = Capacity::measure(backend, &Operation::ALL, duration)?;
    let acu = capacity.acu_per_core();
    println!(
        "ACU (RSA-2048 private-key operations/s): {acu:.0} per core, {:.0} for the machine",
        acu * cores as f64
    );
    println!(
        "{:<14} {:<26} {:>12} {:>12} {:>10} {:>10}",
        "op", "one operation is", "scalar/s", "batched/s", "ACU alone", "ACU batched"
    );
    for rate in &capacity.rates {
        let batched = rate
            .batched_per_s
            .map_or("n/a".to_owned(), |b| format!("{b:.0}"));
        let cost = |batched| {
            capacity
                .acu_cost(rate, batched)
                .map_or("n/a".to_owned(), |c| format!("{c:.3}"))
        };
        println!(
            "{:<14} {:<26} {:>12.0} {:>12} {:>10} {:>10}",
            rate.op.name(),
            rate.op.describe(),
            rate.scalar_per_s,
            batched,
            cost(false),
            cost(true)
        );
        let _ = std::io::stdout().flush();
    }
    println!("SCU (Mbps of 16 KiB records sealed):");
    println!("{:<18} {:>12} {:>14}", "cipher", "per core", "machine");
    for (name, cipher) in CIPHERS {
        let scu = scu_per_core(cipher, duration);
        println!("{name:<18} {scu:>12.0} {:>14.0}", scu * cores as f64);
    }
    println!("An operation's ACU is the share of a core's second it takes over an RSA-2048 operation's with this backend: \"alone\" computed one by one, \"batched\" in full 8-lane calls. The machine's figures assume its cores scale alike.");
    Ok(())
}
