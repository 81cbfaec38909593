//! How the analyses print byte counts in their text: MiB with one decimal (tables, the
//! report, replay rows, phases) or two (summaries, categories, steps). One place, so that a
//! figure reads the same in every command that prints it.

const MIB: f64 = (1u64 << 20) as f64;

/// `b` as MiB with one decimal: `12.5 MiB`.
pub fn mib1(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / MIB)
}

/// `b` as MiB with two decimals: `12.50 MiB`.
pub fn mib2(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / MIB)
}

/// A signed difference of bytes as MiB with two decimals: `+12.50 MiB`, `-3.00 MiB`.
pub fn signed_mib2(d: i128) -> String {
    format!("{:+.2} MiB", d as f64 / MIB)
}
