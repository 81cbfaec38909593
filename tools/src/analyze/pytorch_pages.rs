//! PyTorch's own expandable segments as a configuration of the replay, beside cushim's.
//!
//! Policy: the engine's expandable segments map cushim's page plan (pages of at most 2 or
//! 20 MiB sized to the shortfall, free pages moved between holes). PyTorch maps pages of
//! exactly 2 MiB (small pool) or 20 MiB (large pool) at whole-page offsets of one virtual
//! reservation per stream and pool, and gives pages back only when it releases its cache.
//! A replay of what PyTorch would do needs the second, so the replay knows one key more
//! than the shim: `pytorch_expandable_segments:True` is `expandable_segments:True` under
//! PyTorch's page plan (`AllocConf::expandable_fixed_pages`). A PyTorch snapshot recorded
//! with `expandable_segments:True` is replayed under PyTorch's plan for its recorded row,
//! since PyTorch's allocator made it; a cushim snapshot under cushim's.

use cushim::config::alloc::{parse, AllocConf};

/// The replay-only key naming PyTorch's expandable segments.
pub const KEY: &str = "pytorch_expandable_segments";

/// `conf` parsed as the engine parses it, with [`KEY`] read as `expandable_segments`
/// under PyTorch's page plan. Errors as `parse` gives them.
pub fn parse_conf(conf: &str) -> (AllocConf, Vec<String>) {
    let mut fixed = None;
    let rest: Vec<String> = conf
        .split(',')
        .filter_map(|kv| match kv.trim().split_once(':') {
            Some((k, v)) if k.trim() == KEY => {
                fixed = Some(v.trim().to_string());
                None
            }
            _ => Some(kv.to_string()),
        })
        .collect();
    let Some(v) = fixed else {
        return parse(conf);
    };
    let mut engine = rest.join(",");
    if !engine.trim().is_empty() {
        engine.push(',');
    }
    engine.push_str(&format!("expandable_segments:{v}"));
    let (mut c, errs) = parse(&engine);
    c.raw = conf.to_string();
    c.expandable_fixed_pages = c.expandable_segments;
    (c, errs)
}

/// The recorded settings as the replay runs them: a PyTorch snapshot's expandable segments
/// are PyTorch's (`pytorch` is whether PyTorch's allocator recorded the input).
pub fn recorded_conf(settings: &str, pytorch: bool) -> String {
    if !pytorch {
        return settings.to_string();
    }
    settings
        .split(',')
        .map(|kv| match kv.trim().split_once(':') {
            Some((k, v)) if k.trim() == "expandable_segments" && is_true(v) => {
                format!("{KEY}:{}", v.trim())
            }
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn is_true(v: &str) -> bool {
    matches!(v.trim(), "True" | "true" | "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pytorch_key_turns_on_expandable_segments_with_fixed_pages() {
        let (c, errs) = parse_conf("max_split_size_mb:128,pytorch_expandable_segments:True");
        assert!(errs.is_empty(), "{errs:?}");
        assert!(c.expandable_segments && c.expandable_fixed_pages);
        assert_eq!(c.max_split_size, 128 << 20);
        let (c, _) = parse_conf("expandable_segments:True");
        assert!(c.expandable_segments && !c.expandable_fixed_pages);
        assert_eq!(
            recorded_conf("expandable_segments:True", true),
            "pytorch_expandable_segments:True"
        );
        assert_eq!(
            recorded_conf("expandable_segments:True", false),
            "expandable_segments:True"
        );
    }
}
