//! Fault injection (`SIMCUDA_FAIL`): `name@N` fails the Nth call, `name@every:K` every Kth,
//! `name@after:K` every call after the Kth; comma-separated; an optional `=CODE` overrides the
//! returned code. Invariant: a failing call returns before doing anything, with the error the
//! real call would give for lack of resources (out of memory for allocation-type calls).

use crate::api::{by_name, COUNT, NAMES};
use crate::error::{CUresult, OUT_OF_MEMORY, UNKNOWN};
use once_cell::sync::Lazy;

#[derive(Debug, Clone, Copy)]
enum When {
    Nth(u64),
    Every(u64),
    After(u64),
}

#[derive(Debug, Clone, Copy)]
struct Rule {
    when: When,
    code: CUresult,
}

static PLAN: Lazy<Option<Vec<Vec<Rule>>>> = Lazy::new(|| {
    let spec = std::env::var("SIMCUDA_FAIL").ok()?;
    let mut plan = vec![Vec::new(); COUNT];
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match parse(item) {
            Some((id, rule)) => plan[id].push(rule),
            None => eprintln!("simcuda: SIMCUDA_FAIL item {item:?} not understood; ignored"),
        }
    }
    Some(plan)
});

fn parse(item: &str) -> Option<(usize, Rule)> {
    let (name, rest) = item.split_once('@')?;
    let id = by_name(name.trim())?;
    let (when, code) = match rest.split_once('=') {
        Some((w, c)) => (w, c.trim().parse().ok()?),
        None => (rest, default_code(NAMES[id])),
    };
    let when = if let Some(k) = when.strip_prefix("every:") {
        When::Every(k.parse().ok().filter(|k| *k > 0)?)
    } else if let Some(k) = when.strip_prefix("after:") {
        When::After(k.parse().ok()?)
    } else {
        When::Nth(when.parse().ok()?)
    };
    Some((id, Rule { when, code }))
}

/// What the real call returns when the driver runs out of resources.
fn default_code(name: &str) -> CUresult {
    const RESOURCE_CALLS: &[&str] = &[
        "Malloc",
        "Alloc",
        "Create",
        "Map",
        "SetAccess",
        "AddressReserve",
        "Retain",
        "Record",
        "LaunchHostFunc",
        "Memcpy",
        "Memset",
    ];
    if RESOURCE_CALLS.iter().any(|k| name.contains(k)) {
        OUT_OF_MEMORY
    } else if name == "cuInit" {
        crate::error::NO_DEVICE
    } else {
        UNKNOWN
    }
}

/// The injected failure of call number `n` (1-based) of entry point `id`, if any.
pub fn check(id: usize, n: u64) -> Option<CUresult> {
    let plan = PLAN.as_ref()?;
    plan[id].iter().find_map(|r| {
        let hit = match r.when {
            When::Nth(k) => n == k,
            When::Every(k) => n % k == 0,
            When::After(k) => n > k,
        };
        hit.then_some(r.code)
    })
}
