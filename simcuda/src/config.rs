//! The `SIMCUDA_*` environment, read once. Invariant: a malformed value is reported on stderr
//! once and replaced by its default; it never aborts the host program.

/// Process-wide settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Per-device capacity in bytes (`SIMCUDA_MEM_MB`, default 16384).
    pub mem_bytes: u64,
    /// Device count (`SIMCUDA_DEVICES`, default 1).
    pub devices: usize,
    /// Pinned host capacity in bytes (`SIMCUDA_HOST_MEM_MB`, default 16384).
    pub host_mem_bytes: u64,
    /// Virtual memory management supported (`SIMCUDA_VMM`, default 1).
    pub vmm: bool,
}

fn number(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("simcuda: {var}={v:?} is not a number; using {default}");
            default
        }),
        Err(_) => default,
    }
}

impl Config {
    /// Read the environment.
    pub fn from_env() -> Config {
        let devices = number("SIMCUDA_DEVICES", 1).min(64) as usize;
        Config {
            mem_bytes: number("SIMCUDA_MEM_MB", 16384).saturating_mul(1 << 20),
            devices,
            host_mem_bytes: number("SIMCUDA_HOST_MEM_MB", 16384).saturating_mul(1 << 20),
            vmm: std::env::var("SIMCUDA_VMM").map_or(true, |v| v.trim() != "0"),
        }
    }
}
