//! `OPENSSL_ia32cap`, the CPU-feature mask operators already set for aws-lc and OpenSSL,
//! honoured by crypto_mb's applicability: clearing AVX-512 IFMA there makes terminus
//! behave as on a CPU without it.
//!
//! The variable is read as aws-lc reads it (`crypto/fipsmodule/cpucap/cpu_intel.c`,
//! `handle_cpu_env`): aws-lc is terminus's TLS crypto and reads the same variable in the
//! same process, so one mask means one thing to both. Up to two values separated by `:`;
//! the first is CPUID leaf 1 (EDX in the low 32 bits, ECX in the high), the second CPUID
//! leaf 7 (EBX low, ECX high). Each value is a 64-bit number, hexadecimal after `0x`,
//! else decimal, read by `sscanf` (leading white space and a sign allowed, digits up to
//! the first other character), and prefixed by `~` (the probed word AND its complement),
//! `|` (OR) or nothing (the value replaces the word). A value without digits leaves its
//! word as probed, and so does a missing second value.
//!
//! OpenSSL (`crypto/cpuid.c`) reads the same format, but differs at the edges: a leading
//! `0` means octal, `0X` is hexadecimal too, `|` is not known, a plain value without
//! digits sets its word to 0, and a first value without a second zeroes leaf 7
//! altogether. There, aws-lc's reading is the one followed, as it is the library whose
//! AVX-512 paths share the process with crypto_mb: `OPENSSL_ia32cap=~0x...` aimed at a
//! leaf-1 feature (AES-NI, say) does not turn batching off.
//!
//! Only AVX512IFMA (leaf 7, EBX bit 21) counts. The other AVX-512 bits crypto_mb also
//! needs (AVX512F, bit 16, say) are left to aws-lc: `OPENSSL_ia32cap=":~0x10000"` is how
//! an operator turns off aws-lc's AVX-512 paths while crypto_mb keeps batching (bench/simd's
//! `inline-noavx512`, bench/README.md), and IFMA is what crypto_mb is about.

/// AVX512IFMA: CPUID leaf 7, EBX bit 21, the low half of the second value.
pub(crate) const AVX512IFMA: u64 = 1 << 21;

/// How one value of the variable changes its 64-bit word of probed features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Word {
    /// `~v`: the probed word AND NOT `v`.
    Clear(u64),
    /// `|v`: the probed word OR `v` (it cannot add a feature the CPU lacks: crypto_mb's
    /// own probe still decides that).
    Set(u64),
    /// `v`: the word replaced by `v`.
    Replace(u64),
}

impl Word {
    /// Whether `bit` of a word the CPU has it in is cleared by this value.
    fn clears(self, bit: u64) -> bool {
        match self {
            Word::Clear(v) => v & bit != 0,
            Word::Set(_) => false,
            Word::Replace(v) => v & bit == 0,
        }
    }
}

/// True when `OPENSSL_ia32cap`'s value `value` clears AVX-512 IFMA, so that crypto_mb must
/// not run.
pub(crate) fn clears_ifma(value: &str) -> bool {
    // The second value: everything after the first ':' (aws-lc's `strchr`); `sscanf`
    // stops at any further ':'.
    let Some((_, leaf7)) = value.split_once(':') else {
        return false;
    };
    parse_word(leaf7).is_some_and(|w| w.clears(AVX512IFMA))
}

/// One value: its prefix, then `0x` and hexadecimal digits, or decimal digits. None (the
/// word left as probed) where no number follows.
fn parse_word(value: &str) -> Option<Word> {
    let (op, number): (fn(u64) -> Word, &str) = match value.as_bytes().first() {
        Some(b'~') => (Word::Clear, &value[1..]),
        Some(b'|') => (Word::Set, &value[1..]),
        _ => (Word::Replace, value),
    };
    let v = match number.strip_prefix("0x") {
        Some(hex) => scan_u64(hex, 16)?,
        None => scan_u64(number, 10)?,
    };
    Some(op(v))
}

/// `sscanf`'s `%lx` or `%lu` (glibc's `strtoull`): leading white space, an optional sign,
/// for `%lx` an optional `0x` or `0X`, then the longest run of digits in `radix`; out of
/// range saturates, a minus negates modulo 2^64. None without a digit.
fn scan_u64(text: &str, radix: u32) -> Option<u64> {
    let text = text.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (negative, mut text) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if radix == 16 {
        if let Some(rest) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
            // "0x" without a hex digit after it is the number 0.
            text = if rest.starts_with(|c: char| c.is_ascii_hexdigit()) {
                rest
            } else {
                "0"
            };
        }
    }
    let digits: Vec<u32> = text.chars().map_while(|c| c.to_digit(radix)).collect();
    if digits.is_empty() {
        return None;
    }
    let v = digits.iter().try_fold(0u64, |acc, &d| {
        acc.checked_mul(u64::from(radix))?.checked_add(u64::from(d))
    });
    Some(match v {
        None => u64::MAX,
        Some(v) if negative => v.wrapping_neg(),
        Some(v) => v,
    })
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::sync::Arc;

    use super::*;
    use crate::multibuffer::{applicable, cpu_runs_crypto_mb, MultibufferBackend};
    use crate::{BackendKind, EngineMetrics};

    /// Set in the child run of [`the_process_decides_by_the_mask`]: what it must see.
    const EXPECT: &str = "TERMINUS_TEST_IA32CAP_EXPECT";

    /// The process-wide decision reads the variable: this test binary, run again with
    /// `OPENSSL_ia32cap` clearing IFMA, decides everything as on a CPU without IFMA (auto
    /// is scalar, no multibuffer backend); without the variable, or with a mask of another
    /// bit, as crypto_mb's own probe says. The child is this same test.
    #[test]
    fn the_process_decides_by_the_mask() {
        if let Ok(expect) = std::env::var(EXPECT) {
            let metrics = Arc::new(EngineMetrics::new(BackendKind::Multibuffer));
            let runs = match expect.as_str() {
                "masked" => false,
                "cpu" => cpu_runs_crypto_mb(),
                other => panic!("{EXPECT}={other:?}"),
            };
            assert_eq!(
                applicable(),
                runs,
                "OPENSSL_ia32cap={:?}",
                std::env::var("OPENSSL_ia32cap")
            );
            let auto = if runs {
                BackendKind::Multibuffer
            } else {
                BackendKind::Scalar
            };
            assert_eq!(BackendKind::auto(), auto);
            assert_eq!(MultibufferBackend::new(metrics).is_some(), runs);
            return;
        }
        // This process (the CI's masked pass sets the variable for it).
        let mask = std::env::var("OPENSSL_ia32cap").unwrap_or_default();
        assert_eq!(applicable(), cpu_runs_crypto_mb() && !clears_ifma(&mask));
        let test = "multibuffer::ia32cap::tests::the_process_decides_by_the_mask";
        for (mask, expect) in [
            (Some(":~0x200000"), "masked"),
            (Some("~0x200000:~0x200000"), "masked"),
            (Some(":0x0"), "masked"),
            (Some(":~0x10000"), "cpu"),
            (Some("~0x200000"), "cpu"),
            (None, "cpu"),
        ] {
            let mut child = Command::new(std::env::current_exe().unwrap());
            child
                .args(["--exact", test, "--test-threads=1"])
                .env(EXPECT, expect);
            match mask {
                Some(mask) => child.env("OPENSSL_ia32cap", mask),
                None => child.env_remove("OPENSSL_ia32cap"),
            };
            let out = child.output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("1 passed"),
                "OPENSSL_ia32cap={mask:?}, expected {expect}:\n{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    #[test]
    fn clearing_ifma_in_the_second_value_masks_crypto_mb() {
        for mask in [
            ":~0x200000",
            "~0x200000:~0x200000",
            "0x0:~0x200000",
            ":~2097152",
            ":~0xffffffffffffffff",
            // IFMA and AVX512F at once, and leaf 7's ECX bits besides.
            ":~0x210000",
            ":~0xffffffff00200000",
            // The value replaces the word: IFMA not in it.
            ":0x0",
            ":0",
            ":0x10000",
            ":0xffffffffffdfffff",
            // sscanf: white space and a sign before the digits, digits up to the first
            // other character (a third value is not read).
            ":~ 2097152",
            ":~+2097152",
            ":~0x0x200000",
            ":~0x200000:0",
            ":~0x200000zz",
            // A negative number wraps: -1 is every bit.
            ":~-1",
            // Out of range saturates to every bit.
            ":~0x1ffffffffffffffffff",
        ] {
            assert!(clears_ifma(mask), "{mask:?} clears IFMA");
        }
    }

    #[test]
    fn masks_that_leave_ifma_keep_crypto_mb() {
        for mask in [
            "",
            // The first value is leaf 1's word: leaf 7 left as probed (aws-lc; OpenSSL
            // would zero leaf 7 here).
            "~0x200000",
            "~0x200000000000000",
            "0x0",
            "~0x200000:",
            // Other leaf-7 bits: AVX512F alone (bench/simd's inline-noavx512), AVX2, the
            // IFMA bit of leaf 7's ECX half (bit 53 is ECX bit 21, not IFMA).
            ":~0x10000",
            ":~0x20",
            ":~0x20000000000000",
            ":~0x80000000",
            // A replacing value with IFMA in it, and OR.
            ":0x200000",
            ":0xffffffffffffffff",
            ":|0x200000",
            ":|0",
            ":~0",
        ] {
            assert!(!clears_ifma(mask), "{mask:?} leaves IFMA");
        }
    }

    #[test]
    fn values_without_a_number_are_ignored() {
        for mask in [
            ":",
            ":~",
            ":~0x",
            ":~zz",
            ":zz",
            ":0xzz",
            ": ~0x200000",
            ":~~0x200000",
            // aws-lc takes only a lower-case x as hexadecimal: "0X200000" is the decimal 0.
            ":~0X200000",
            "::~0x200000",
            ":|",
            ":-",
            // A sign before "0x" makes it decimal: "+0x200000" is +0.
            ":~+0x200000",
        ] {
            assert!(!clears_ifma(mask), "{mask:?} is ignored");
        }
        // A plain value with no digits leaves the word (OpenSSL would set it to 0).
        assert_eq!(parse_word("zz"), None);
        assert_eq!(parse_word("0x"), None);
        assert_eq!(parse_word("~0x0xzz"), Some(Word::Clear(0)));
    }

    #[test]
    fn values_read_as_sscanf_reads_them() {
        assert_eq!(parse_word("~0x200000"), Some(Word::Clear(0x20_0000)));
        assert_eq!(parse_word("|0x10"), Some(Word::Set(0x10)));
        assert_eq!(parse_word("0x10"), Some(Word::Replace(0x10)));
        assert_eq!(parse_word("16"), Some(Word::Replace(16)));
        // Decimal: a leading 0 is not octal (aws-lc's %lu).
        assert_eq!(parse_word("010"), Some(Word::Replace(10)));
        assert_eq!(parse_word("~0xAbC:"), Some(Word::Clear(0xabc)));
        assert_eq!(parse_word("\t 7x"), Some(Word::Replace(7)));
        assert_eq!(parse_word("-1"), Some(Word::Replace(u64::MAX)));
        assert_eq!(
            parse_word("99999999999999999999"),
            Some(Word::Replace(u64::MAX))
        );
        assert_eq!(
            parse_word("18446744073709551615"),
            Some(Word::Replace(u64::MAX))
        );
    }
}
