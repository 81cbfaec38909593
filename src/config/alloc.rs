//! `CUSHIM_ALLOC_CONF`: PyTorch's `PYTORCH_CUDA_ALLOC_CONF` keys and syntax, plus shim keys.
//!
//! Invariant: parsing never fails. Every bad key or value yields one message naming it and
//! the accepted values, and leaves that setting at its default; every other key still
//! applies. The parsed [`AllocConf`] is immutable afterwards.

use std::io::Write;

/// Number of power-of-two size intervals for `roundup_power2_divisions` (1 MiB .. 64 GiB).
pub const ROUNDUP_INTERVALS: usize = 16;

const MIB: u64 = 1 << 20;

/// When a freed block may be handed out again (see `alloc::pending`, `alloc::barrier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeSync {
    /// Immediate reuse while the program has created no stream and only one thread
    /// allocates; GPU-side ordering barriers afterwards (as `Barrier`).
    Auto,
    /// GPU-side ordering barriers from the first free: reuse at once, no CPU wait.
    Barrier,
    /// Event batches from the first free, waited for on the CPU.
    Event,
    /// Synchronize the device instead of recording events.
    Device,
    /// Always reuse at once (the program promises its own ordering).
    None,
}

impl FreeSync {
    pub fn name(self) -> &'static str {
        match self {
            FreeSync::Auto => "auto",
            FreeSync::Barrier => "barrier",
            FreeSync::Event => "event",
            FreeSync::Device => "device",
            FreeSync::None => "none",
        }
    }
}

/// The allocator's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocConf {
    /// The raw configuration string.
    pub raw: String,
    /// Blocks at least this large are never split; `u64::MAX` means unlimited.
    pub max_split_size: u64,
    /// An oversize request takes a cached block only if it wastes less than this (20 MiB).
    pub max_non_split_rounding_size: u64,
    /// Fraction of the allowed memory above which cached blocks are garbage collected
    /// (0 = off).
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    /// Divisions per power-of-two interval (index 0 covers everything below 2 MiB,
    /// index i covers [2^(20+i), 2^(21+i)) bytes, the last one everything above).
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// Fraction of the device's total memory this process may reserve (1.0 = all).
    pub per_process_memory_fraction: f64,
    pub pinned_num_register_threads: u64,
    pub pinned_use_cuda_host_register: bool,
    pub release_lock_on_cudamalloc: bool,
    pub free_sync: FreeSync,
    pub free_includes_cache: bool,
    /// Cap on cached-but-unused bytes (`max_cached_mb`); `u64::MAX` means no cap.
    pub max_cached: u64,
    /// Cap on cached-but-unused bytes as a fraction of the device's memory
    /// (`max_cached_fraction`); 0 means no cap. With both set the smaller applies.
    pub max_cached_fraction: f64,
    /// Whether either cap key was given (set by [`parse`]): the one test every free makes,
    /// a single load and branch instead of a test of both fields (BENCHMARKS.md,
    /// "Measurements behind design choices").
    pub cache_cap_on: bool,
    /// Expandable segments grow as PyTorch's do: pages of exactly 2 MiB (small pool) or
    /// 20 MiB (large pool), aligned on the reservation's base, never moved from one
    /// reservation to another. Not a key of the configuration string: the offline replay
    /// sets it to model PyTorch's allocator; the shim always uses its own page plan.
    pub expandable_fixed_pages: bool,
    /// Sleep mode (`sleep_mode:True`): `cudaMalloc`/`cuMemAlloc` are served on
    /// virtual-memory mappings that can be paused and resumed by tag (`crate::sleep`).
    pub sleep_mode: bool,
}

impl Default for AllocConf {
    fn default() -> Self {
        AllocConf {
            raw: String::new(),
            max_split_size: u64::MAX,
            max_non_split_rounding_size: 20 * MIB,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            per_process_memory_fraction: 1.0,
            pinned_num_register_threads: 1,
            pinned_use_cuda_host_register: false,
            release_lock_on_cudamalloc: false,
            free_sync: FreeSync::Auto,
            free_includes_cache: false,
            max_cached: u64::MAX,
            max_cached_fraction: 0.0,
            cache_cap_on: false,
            expandable_fixed_pages: false,
            sleep_mode: false,
        }
    }
}

fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(format!("{key}: bad value '{v}' (accepted: True, False)")),
    }
}

fn parse_fraction(key: &str, v: &str, lo_open: bool, hi_open: bool) -> Result<f64, String> {
    let range = match (lo_open, hi_open) {
        (true, true) => "0 < x < 1",
        _ => "0 <= x <= 1",
    };
    let x: f64 = v
        .parse()
        .map_err(|_| format!("{key}: bad value '{v}' (accepted: a number, {range})"))?;
    let lo_ok = if lo_open { x > 0.0 } else { x >= 0.0 };
    let hi_ok = if hi_open { x < 1.0 } else { x <= 1.0 };
    if lo_ok && hi_ok {
        Ok(x)
    } else {
        Err(format!("{key}: value {v} out of range (accepted: {range})"))
    }
}

/// An integer number of MiB, at least 20 (PyTorch's minimum, `kLargeBuffer`), in bytes.
fn parse_mb_at_least_20(key: &str, v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(mb) if mb >= 20 => Ok(mb.saturating_mul(MIB)),
        _ => Err(format!(
            "{key}: bad value '{v}' (accepted: an integer >= 20)"
        )),
    }
}

fn pow2_value(key: &str, v: &str) -> Result<u64, String> {
    match v.trim().parse::<u64>() {
        Ok(n) if n == 0 || n.is_power_of_two() => Ok(n),
        _ => Err(format!(
            "{key}: bad value '{v}' (accepted: a power of two, or a list like [256:1,512:2,>:8] \
             with power-of-two sizes in MB)"
        )),
    }
}

/// Parse `roundup_power2_divisions`: one power of two (or 0) for every interval, or a list
/// of `size_mb:divisions` entries (sizes are powers of two in MiB, ascending). As current
/// PyTorch parses it (`AcceleratorAllocatorConfig::parseRoundUpPower2Divisions` in
/// `c10/core/AllocatorConfig.cpp`): `S:D` sets the interval starting at S MiB, the first
/// entry also fills every interval below it, and `>:D` fills from the interval *after* the
/// last one named (after interval 0 when none was named) to the end. So in
/// `[256:1,512:2,>:8]` the 512 MiB interval keeps its 2 divisions and only 1 GiB and above
/// get 8. (PyTorch before the `ConfigTokenizer` rewrite filled from the last named interval
/// itself, which let `>` override it.)
fn parse_roundup(v: &str) -> Result<[u64; ROUNDUP_INTERVALS], String> {
    const KEY: &str = "roundup_power2_divisions";
    let mut out = [0u64; ROUNDUP_INTERVALS];
    let v = v.trim();
    if let Some(inner) = v.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| format!("{KEY}: missing ']' in '{v}'"))?;
        // PyTorch's `last_index`: 0 until an interval is named.
        let mut last = 0usize;
        let mut first = true;
        for entry in inner.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (size, div) = entry.split_once(':').ok_or_else(|| {
                format!("{KEY}: bad entry '{entry}' (accepted: SIZE_MB:DIV or >:DIV)")
            })?;
            let div = pow2_value(KEY, div)?;
            if size.trim() == ">" {
                // From the interval after the last named one, to the end.
                for slot in out.iter_mut().skip(last + 1) {
                    *slot = div;
                }
                continue;
            }
            let mb = pow2_value(KEY, size)?;
            if mb == 0 {
                return Err(format!(
                    "{KEY}: interval sizes must be powers of two ('{entry}')"
                ));
            }
            let index = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
            if first {
                for slot in out.iter_mut().take(index) {
                    *slot = div;
                }
                first = false;
            }
            out[index] = div;
            last = index;
        }
        Ok(out)
    } else {
        let div = pow2_value(KEY, v)?;
        Ok([div; ROUNDUP_INTERVALS])
    }
}

/// Split `key:value,key:value` at top-level commas (commas inside `[...]` belong to a list).
fn split_pairs(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Parse a configuration string. Returns the configuration (defaults for every bad setting)
/// and one message per bad key or value.
pub fn parse(s: &str) -> (AllocConf, Vec<String>) {
    let mut conf = AllocConf {
        raw: s.to_string(),
        ..AllocConf::default()
    };
    let mut errors = Vec::new();
    for pair in split_pairs(s) {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let Some((key, value)) = pair.split_once(':') else {
            errors.push(format!("'{pair}': expected key:value"));
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let r: Result<(), String> = match key {
            // PyTorch's `parseMaxSplitSize` (c10/core/AllocatorConfig.cpp): at least
            // kLargeBuffer / kMB = 20, so 20 itself is accepted.
            "max_split_size_mb" => {
                parse_mb_at_least_20(key, value).map(|bytes| conf.max_split_size = bytes)
            }
            // Deviation: PyTorch also requires at least 20 here; any integer is kept (0 makes
            // an oversize request take only a cached block of exactly its size).
            "max_non_split_rounding_mb" => match value.parse::<u64>() {
                Ok(mb) => {
                    conf.max_non_split_rounding_size = mb.saturating_mul(MIB);
                    Ok(())
                }
                _ => Err(format!(
                    "max_non_split_rounding_mb: bad value '{value}' (accepted: an integer)"
                )),
            },
            "garbage_collection_threshold" => {
                parse_fraction(key, value, true, true).map(|x| conf.garbage_collection_threshold = x)
            }
            "per_process_memory_fraction" => {
                parse_fraction(key, value, false, false).map(|x| conf.per_process_memory_fraction = x)
            }
            "expandable_segments" => parse_bool(key, value).map(|b| conf.expandable_segments = b),
            "roundup_power2_divisions" => {
                parse_roundup(value).map(|d| conf.roundup_power2_divisions = d)
            }
            "pinned_use_cuda_host_register" => {
                parse_bool(key, value).map(|b| conf.pinned_use_cuda_host_register = b)
            }
            "release_lock_on_cudamalloc" => {
                parse_bool(key, value).map(|b| conf.release_lock_on_cudamalloc = b)
            }
            "pinned_num_register_threads" => match value.parse::<u64>() {
                Ok(n) if n.is_power_of_two() && n <= 128 => {
                    conf.pinned_num_register_threads = n;
                    Ok(())
                }
                _ => Err(format!(
                    "pinned_num_register_threads: bad value '{value}' (accepted: a power of two <= 128)"
                )),
            },
            // PyTorch keys without meaning here: accepted and ignored.
            "pinned_use_background_threads"
            | "pinned_reserve_segment_size_mb"
            | "expandable_segments_handle_type"
            | "graph_capture_record_stream_reuse" => Ok(()),
            "backend" => match value {
                "native" => Ok(()),
                _ => Err(format!(
                    "backend: '{value}' is not supported (accepted: native)"
                )),
            },
            "free_sync" => match value {
                "auto" => Some(FreeSync::Auto),
                "barrier" => Some(FreeSync::Barrier),
                "event" => Some(FreeSync::Event),
                "device" => Some(FreeSync::Device),
                "none" => Some(FreeSync::None),
                _ => None,
            }
            .map(|m| conf.free_sync = m)
            .ok_or_else(|| {
                format!(
                    "free_sync: bad value '{value}' (accepted: auto, barrier, event, device, none)"
                )
            }),
            "free_includes_cache" => parse_bool(key, value).map(|b| conf.free_includes_cache = b),
            "sleep_mode" => parse_bool(key, value).map(|b| conf.sleep_mode = b),
            // ND4J-style cap on what the cache keeps (see `alloc::cap`).
            "max_cached_mb" => match value.parse::<u64>() {
                Ok(mb) => {
                    conf.max_cached = mb.saturating_mul(MIB);
                    Ok(())
                }
                _ => Err(format!(
                    "max_cached_mb: bad value '{value}' (accepted: an integer >= 0)"
                )),
            },
            "max_cached_fraction" => {
                parse_fraction(key, value, false, false).map(|x| conf.max_cached_fraction = x)
            }
            _ => Err(format!(
                "unknown key '{key}' (accepted: max_split_size_mb, max_non_split_rounding_mb, \
                 garbage_collection_threshold, \
                 expandable_segments, roundup_power2_divisions, per_process_memory_fraction, \
                 pinned_use_cuda_host_register, pinned_num_register_threads, \
                 release_lock_on_cudamalloc, backend, free_sync, free_includes_cache, \
                 max_cached_mb, max_cached_fraction, sleep_mode)"
            )),
        };
        if let Err(e) = r {
            errors.push(e);
        }
    }
    conf.cache_cap_on = conf.max_cached != u64::MAX || conf.max_cached_fraction > 0.0;
    (conf, errors)
}

impl AllocConf {
    /// Read `CUSHIM_ALLOC_CONF`; print each problem once on stderr (`cushim: ...`).
    pub fn from_env() -> AllocConf {
        let raw = std::env::var("CUSHIM_ALLOC_CONF").unwrap_or_default();
        let (conf, errors) = parse(&raw);
        let mut err = std::io::stderr().lock();
        for e in errors {
            let _ = writeln!(err, "cushim: CUSHIM_ALLOC_CONF: {e}; using the default");
        }
        conf
    }

    /// Whether a cap on cached bytes is set (`max_cached_mb` or `max_cached_fraction`).
    #[inline(always)]
    pub fn cache_capped(&self) -> bool {
        self.cache_cap_on
    }

    /// The cap on cached-but-unused bytes for a device of `total` bytes (`u64::MAX`: none).
    pub fn cache_cap(&self, total: u64) -> u64 {
        let by_fraction = if self.max_cached_fraction > 0.0 {
            (total as f64 * self.max_cached_fraction) as u64
        } else {
            u64::MAX
        };
        self.max_cached.min(by_fraction)
    }

    /// Divisions for a request of `size` bytes (0 or 1 = plain 512-byte rounding).
    #[inline]
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.max(1).leading_zeros() as usize;
        let index = log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1);
        self.roundup_power2_divisions[index]
    }

    /// PyTorch's `allocator_settings` snapshot dictionary, plus the shim keys.
    pub fn settings_json(&self) -> serde_json::Value {
        let mut roundup = serde_json::Map::new();
        for (i, d) in self.roundup_power2_divisions.iter().enumerate() {
            roundup.insert((1u64 << i).to_string(), serde_json::Value::from(*d));
        }
        let max_split: i64 = if self.max_split_size == u64::MAX {
            -1
        } else {
            i64::try_from(self.max_split_size).unwrap_or(i64::MAX)
        };
        serde_json::json!({
            "PYTORCH_CUDA_ALLOC_CONF": self.raw,
            "max_split_size": max_split,
            "max_non_split_rounding_size": self.max_non_split_rounding_size,
            "garbage_collection_threshold": self.garbage_collection_threshold,
            "expandable_segments": self.expandable_segments,
            "roundup_power2_divisions": serde_json::Value::Object(roundup),
            "pinned_num_register_threads": self.pinned_num_register_threads,
            "release_lock_on_cudamalloc": self.release_lock_on_cudamalloc,
            "pinned_use_host_register": self.pinned_use_cuda_host_register,
            "per_process_memory_fraction": self.per_process_memory_fraction,
            "free_sync": self.free_sync.name(),
            "free_includes_cache": self.free_includes_cache,
            "max_cached": if self.max_cached == u64::MAX {
                -1
            } else {
                i64::try_from(self.max_cached).unwrap_or(i64::MAX)
            },
            "max_cached_fraction": self.max_cached_fraction,
            "sleep_mode": self.sleep_mode,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn empty_string_gives_defaults_without_messages() {
        let (c, e) = parse("");
        assert!(e.is_empty());
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.free_sync, FreeSync::Auto);
    }

    #[test]
    fn full_configuration_parses_every_key() {
        let (c, e) = parse(
            "expandable_segments:True,max_split_size_mb:256,garbage_collection_threshold:0.8,\
             roundup_power2_divisions:[256:1,512:2,>:8],free_sync:event,free_includes_cache:True,\
             per_process_memory_fraction:0.5,backend:native,pinned_num_register_threads:8",
        );
        assert!(e.is_empty(), "{e:?}");
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, 256 * MIB);
        assert_eq!(c.garbage_collection_threshold, 0.8);
        assert_eq!(c.free_sync, FreeSync::Event);
        assert!(c.free_includes_cache);
        assert_eq!(c.per_process_memory_fraction, 0.5);
        // 256 MiB is interval 8: intervals 0..=8 get 1; 512:2 sets 9 and keeps it; `>`
        // fills 10 (1 GiB) and above with 8.
        assert_eq!(c.roundup_power2_divisions[0], 1);
        assert_eq!(c.roundup_power2_divisions[8], 1);
        assert_eq!(c.roundup_power2_divisions[9], 2);
        assert_eq!(c.roundup_power2_divisions[10], 8);
        assert_eq!(c.roundup_power2_divisions[15], 8);
        // `>` alone fills from interval 1, as PyTorch's `last_index` starts at 0.
        let (c, _) = parse("roundup_power2_divisions:[>:4]");
        assert_eq!(c.roundup_power2_divisions[0], 0);
        assert!(c.roundup_power2_divisions[1..].iter().all(|&d| d == 4));
        let (c, _) = parse("roundup_power2_divisions:[64:2,256:4,1024:8]");
        assert_eq!(
            &c.roundup_power2_divisions[..11],
            &[2, 2, 2, 2, 2, 2, 2, 0, 4, 0, 8]
        );
    }

    #[test]
    fn bad_values_name_the_key_and_keep_defaults_for_it_only() {
        let (c, e) =
            parse("max_split_size_mb:10,free_sync:sometimes,bogus:1,expandable_segments:True");
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].contains("max_split_size_mb"));
        assert!(e[1].contains("auto, barrier, event, device, none"));
        assert!(e[2].contains("bogus"));
        assert_eq!(c.max_split_size, u64::MAX);
        assert!(c.expandable_segments);
    }

    #[test]
    fn max_split_size_accepts_20_mb_and_refuses_less() {
        let (c, e) = parse("max_split_size_mb:20");
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(c.max_split_size, 20 * MIB);
        let (c, e) = parse("max_split_size_mb:19");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains(">= 20"), "{e:?}");
        assert_eq!(c.max_split_size, u64::MAX);
    }

    #[test]
    fn cache_cap_is_off_by_default_and_the_smaller_of_both_keys() {
        let c = AllocConf::default();
        assert!(!c.cache_capped());
        assert_eq!(c.cache_cap(GIB), u64::MAX);
        let (c, e) = parse("max_cached_mb:512,max_cached_fraction:0.25");
        assert!(e.is_empty(), "{e:?}");
        assert!(c.cache_capped());
        assert_eq!(c.cache_cap(4 * GIB), 512 * MIB);
        assert_eq!(c.cache_cap(GIB), 256 * MIB);
        let (c, e) = parse("max_cached_mb:0");
        assert!(e.is_empty() && c.cache_capped() && c.cache_cap(GIB) == 0);
        assert_eq!(parse("max_cached_fraction:1.5").1.len(), 1);
        assert_eq!(parse("max_cached_mb:-1").1.len(), 1);
    }

    #[test]
    fn gc_threshold_must_be_strictly_between_zero_and_one() {
        assert_eq!(parse("garbage_collection_threshold:1.0").1.len(), 1);
        assert_eq!(parse("garbage_collection_threshold:0").1.len(), 1);
        assert!(parse("garbage_collection_threshold:0.5").1.is_empty());
    }

    #[test]
    fn single_roundup_value_applies_everywhere_and_must_be_power_of_two() {
        let (c, e) = parse("roundup_power2_divisions:4");
        assert!(e.is_empty());
        assert!(c.roundup_power2_divisions.iter().all(|&d| d == 4));
        assert_eq!(parse("roundup_power2_divisions:3").1.len(), 1);
    }

    #[test]
    fn settings_json_reports_unlimited_split_as_minus_one() {
        let (c, _) = parse("garbage_collection_threshold:0.5");
        let j = c.settings_json();
        assert_eq!(j["max_split_size"], -1);
        assert_eq!(
            j["PYTORCH_CUDA_ALLOC_CONF"],
            "garbage_collection_threshold:0.5"
        );
        assert_eq!(j["free_sync"], "auto");
        assert_eq!(j["roundup_power2_divisions"]["1"], 0);
    }
}
