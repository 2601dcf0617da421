//! `terminus capacity`: ACU per core and for the machine, each operation's cost in ACU
//! with RSA-2048 as the unit, SCU per cipher, and clear errors.

use std::process::Command;

use crate::harness::{run, terminus_bin};

fn capacity(args: &[&str]) -> (bool, String, String) {
    let out = run(Command::new(terminus_bin()).arg("capacity").args(args));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The (alone, batched) ACU columns of `op`'s row; None where n/a.
fn acu(text: &str, op: &str) -> (f64, Option<f64>) {
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(op))
        .unwrap_or_else(|| panic!("no {op} row:\n{text}"))
        .split_whitespace()
        .collect();
    let n = row.len();
    (row[n - 2].parse().unwrap(), row[n - 1].parse().ok())
}

#[test]
fn rsa2048_is_the_unit_and_every_operation_is_costed_in_it() {
    let batching = terminus_engine::multibuffer::applicable();
    for backend in ["scalar", "auto"] {
        let (ok, text, err) = capacity(&["--backend", backend, "--seconds", "0.05"]);
        assert!(ok, "{text}{err}");
        let line = text
            .lines()
            .find(|l| l.starts_with("ACU"))
            .unwrap_or_else(|| panic!("no ACU line:\n{text}"));
        // "ACU (...): N per core, M for the machine"
        let figures = line.split("): ").nth(1).unwrap_or_else(|| panic!("{line}"));
        let first =
            |part: &str| -> f64 { part.split_whitespace().next().unwrap().parse().unwrap() };
        let mut parts = figures.split(", ");
        let (per_core, machine) = (first(parts.next().unwrap()), first(parts.next().unwrap()));
        let cores = std::thread::available_parallelism().unwrap().get() as f64;
        assert!(per_core > 0.0, "{line}");
        assert!((machine - per_core * cores).abs() <= 1.0, "{line}");
        let batched = backend == "auto" && batching;
        // With batches, their after-effect on scalar code, and ACU per core counting it.
        let effect = text.lines().find(|l| l.starts_with("after-effect"));
        assert_eq!(effect.is_some(), batched, "{text}");
        if let Some(effect) = effect {
            let ratio: f64 = effect
                .split(" runs at ")
                .nth(1)
                .and_then(|r| r.split('x').next())
                .and_then(|r| r.parse().ok())
                .unwrap_or_else(|| panic!("{effect}"));
            let counted = first(effect.split("with it counted: ").nth(1).unwrap());
            assert!(
                (counted - per_core * ratio.min(1.0)).abs() <= 1.0 + per_core * 0.001,
                "{effect}"
            );
        }
        let (rsa_alone, rsa_batched) = acu(&text, "rsa2048");
        if batched {
            assert_eq!(rsa_batched, Some(1.0), "{text}");
            assert!(
                rsa_alone > 1.0,
                "one by one costs more than batched:\n{text}"
            );
        } else {
            assert_eq!((rsa_alone, rsa_batched), (1.0, None), "{text}");
        }
        // ECDSA P-256 signs for a fraction of an RSA-2048 operation, RSA-4096 for several.
        let unit = |op| {
            let (alone, b) = acu(&text, op);
            if batched {
                b.unwrap()
            } else {
                alone
            }
        };
        assert!(unit("ecdsap256") < 1.0, "{text}");
        assert!(unit("rsa4096") > 2.0, "{text}");
        for cipher in ["aes128gcm", "aes256gcm", "chacha20poly1305"] {
            let row = text
                .lines()
                .find(|l| l.starts_with(cipher))
                .unwrap_or_else(|| panic!("no {cipher} row:\n{text}"));
            let mbps: f64 = row.split_whitespace().nth(1).unwrap().parse().unwrap();
            assert!(mbps > 100.0, "{row}");
        }
    }
}

#[test]
fn a_bad_backend_or_duration_is_refused_with_what_to_give() {
    let (ok, _, err) = capacity(&["--backend", "qat"]);
    assert!(!ok);
    assert!(err.contains("give auto, scalar or multibuffer"), "{err}");
    let (ok, _, err) = capacity(&["--seconds", "0"]);
    assert!(!ok);
    assert!(err.contains("--seconds 0 is out of range"), "{err}");
}
