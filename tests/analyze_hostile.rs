//! Hostile input: every analysis given truncated, corrupted or crafted bytes returns one
//! error (or an answer), never panics, never overflows the stack, and never allocates more
//! than a constant factor of the input. A deterministic mutation loop over real inputs of
//! every kind, and hand-made worst cases. (One test per binary: the allocation counter is
//! process-wide.)
//! Covered: summary, replay, diff, report, convert.

mod common;
use common::analyze_support as support;

use cushim::snapshot::value::Value;
use cushim::snapshot::{encode, pickle, Format};
use cushim_tools::analyze::summary::{render, Options};
use cushim_tools::analyze::{diff, input, replay, report};
use cushim_tools::snapshot::reader::{expanded_nodes, read_bytes};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use support::*;

/// Counts live heap bytes and their high-water mark.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Bytes a case may allocate beyond what was live before it: a constant (the engine's
/// tables for replay, formatting) plus a factor of the input.
fn allowance(len: usize) -> usize {
    (16 << 20) + 256 * len
}

/// Everything a command does with input bytes, in process: summary, replay (one
/// configuration), diff against itself, report (replaying the default set), and convert's
/// check before writing JSON.
fn every_command(bytes: &[u8]) -> Vec<Result<(), String>> {
    let mut out = Vec::new();
    let snap = input::from_bytes(bytes);
    // The file path streams a pickle instead of reading it whole: same answer, same error.
    // One file per call: tests run this at once on their own threads.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = std::env::temp_dir().join(format!("cushim-hostile-{}-{n}.bin", std::process::id()));
    if std::fs::write(&file, bytes).is_ok() {
        let streamed = input::read(&file);
        let _ = std::fs::remove_file(&file);
        match (&snap, &streamed) {
            (Ok(a), Ok(b)) => assert_eq!(
                render(a, &Options::default()),
                render(b, &Options::default()),
                "streamed and in-memory reads differ"
            ),
            (Err(a), Err(b)) => assert!(b.ends_with(a.as_str()), "{a:?} vs {b:?}"),
            (a, b) => panic!(
                "in memory {:?}, streamed {:?}",
                a.as_ref().err(),
                b.as_ref().err()
            ),
        }
    }
    out.push(
        snap.as_ref()
            .map(|s| {
                let _ = render(
                    s,
                    &Options {
                        depth: 3,
                        tree: true,
                        top: 5,
                    },
                );
            })
            .map_err(Clone::clone),
    );
    if let Ok(s) = &snap {
        out.push(replay::replay(s, &[String::new()]).map(|r| {
            let _ = replay::render(&r);
        }));
        let _ = diff::render(&diff::diff(s, s, 2), 5);
        out.push(
            report::report(s, "hostile", &[], None)
                .map(|h| assert!(h.len() < allowance(bytes.len()))),
        );
    }
    // Convert reads snapshots only: a log or CSV it refuses is not a hostile-input failure.
    let a_log = snap
        .as_ref()
        .is_ok_and(|s| s.kind == "RMM log" || s.kind == "alloc/free log");
    match read_bytes(bytes) {
        Err(_) if a_log => {}
        Ok(v) => {
            let limit = (bytes.len() as u64 * 1024).max(1 << 20);
            if expanded_nodes(&v, limit + 1) <= limit {
                let _ = encode(&v, Format::Json).map(|j| assert!(j.len() as u64 <= limit * 64));
            }
            out.push(Ok(()));
        }
        Err(e) => out.push(Err(e)),
    }
    out
}

/// Run `every_command` on `bytes`, checking the allocation bound; the errors it returned.
fn check(bytes: &[u8], what: &str) -> Vec<String> {
    if std::env::var_os("HOSTILE_TRACE").is_some() {
        eprintln!("case {what}");
    }
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let res = every_command(bytes);
    let used = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    assert!(
        used <= allowance(bytes.len()),
        "{what}: {used} bytes allocated for a {}-byte input",
        bytes.len()
    );
    res.into_iter().filter_map(Result::err).collect()
}

fn mutate(rng: &mut fastrand::Rng, b: &[u8]) -> Vec<u8> {
    let mut m = b.to_vec();
    let n = m.len().max(1);
    match rng.u8(0..7) {
        0 => m.truncate(rng.usize(0..n)),
        1 => {
            for _ in 0..rng.usize(1..5) {
                if !m.is_empty() {
                    let i = rng.usize(0..m.len());
                    m[i] ^= 1 << rng.u8(0..8);
                }
            }
        }
        2 => {
            // A length or count field made huge.
            let i = rng.usize(0..n);
            let v: &[u8] = match rng.u8(0..3) {
                0 => &[0xff, 0xff, 0xff, 0x7f],
                1 => &[0xff; 8],
                _ => &[0x00, 0x00, 0x00, 0x80, 0xff, 0xff, 0xff, 0x0f],
            };
            for (k, &x) in v.iter().enumerate() {
                if let Some(c) = m.get_mut(i + k) {
                    *c = x;
                }
            }
        }
        3 => {
            let i = rng.usize(0..n);
            let j = (i + rng.usize(1..64)).min(m.len());
            let chunk = m.get(i..j).unwrap_or(&[]).to_vec();
            for _ in 0..rng.usize(1..4) {
                let at = rng.usize(0..=m.len());
                m.splice(at..at, chunk.iter().copied());
            }
        }
        4 => {
            let i = rng.usize(0..n);
            let j = (i + rng.usize(1..32)).min(m.len());
            if i < j {
                m.drain(i..j);
            }
        }
        5 => {
            // A byte set to an interesting opcode or marker.
            let ops = [
                b'h', b'j', b'2', b'(', b']', b'}', b'a', b'e', b's', b'u', 0x94, 0x8d, b'X', b'.',
            ];
            if !m.is_empty() {
                let i = rng.usize(0..m.len());
                m[i] = ops[rng.usize(0..ops.len())];
            }
        }
        _ => {
            let i = rng.usize(0..n);
            m.insert(i.min(m.len()), rng.u8(..));
        }
    }
    m
}

fn corpus() -> Vec<(&'static str, Vec<u8>)> {
    let mut c = vec![
        ("seed pickle", seed_scenario("", Format::Pickle)),
        ("seed json", seed_scenario("", Format::Json)),
        (
            "seed msgpack",
            seed_scenario("expandable_segments:True", Format::Msgpack),
        ),
        ("rmm csv", rmm_csv()),
        ("plain log", plain_log()),
    ];
    if let Some(t) = torch_pickle("") {
        c.push(("torch pickle", t));
    }
    c
}

/// Hand-made worst cases: each must be refused with the given words in its error.
fn worst_cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let mut deep = vec![0x80, 2];
    deep.extend(std::iter::repeat(b']').take(200_000));
    deep.extend(std::iter::repeat(b'a').take(199_999));
    deep.push(b'.');
    let mut deep_tuple = vec![0x80, 2, b'N'];
    deep_tuple.extend(std::iter::repeat(0x85).take(100_000));
    deep_tuple.push(b'.');
    let mut huge_str8 = vec![0x80, 4, 0x8d];
    huge_str8.extend((3u64 << 30).to_le_bytes());
    huge_str8.extend(b"abc.");
    let mut huge_x = vec![0x80, 2, b'X', 0xff, 0xff, 0xff, 0xff];
    huge_x.extend(b"abc.");
    let memo_out = vec![0x80, 2, b'}', b'h', 200, b'.'];
    let memo_far = vec![0x80, 2, b']', b'j', 0xff, 0xff, 0xff, 0xff, b'.'];
    // DUP then APPEND, over and over: each copy of the shared list doubles nothing but
    // costs its length (quadratic without the copy budget).
    let mut dup_append = vec![0x80, 2, b']'];
    for _ in 0..200_000 {
        dup_append.extend([b'2', b'K', 1, b'a']);
    }
    dup_append.push(b'.');
    // Billion laughs: each level a list of the previous level 16 times over (memo GETs).
    let mut laughs = vec![0x80, 2, b'}'];
    laughs.extend([b'X', 8, 0, 0, 0]);
    laughs.extend(b"segments");
    laughs.extend([b']', 0x94, b'K', 1, b'a', b'0']); // slot 0: level 0, [1]
    for lvl in 0..40u8 {
        laughs.extend([b']', b'(']);
        for _ in 0..16 {
            laughs.extend([b'h', lvl]);
        }
        laughs.extend([b'e', 0x94, b'0']); // slot lvl + 1
    }
    laughs.extend([b'h', 40, b's', b'.']);
    // GETs of a container still open at the bottom of a deep stack (a scan per GET would
    // be quadratic).
    let mut many_gets = vec![0x80, 2, b']', 0x94];
    many_gets.extend(std::iter::repeat(b']').take(100_000));
    for _ in 0..100_000 {
        many_gets.extend([b'h', 0]);
    }
    many_gets.push(b'.');
    let wrong_type = pickle::to_bytes(&Value::dict(vec![(
        Value::str("segments"),
        Value::str("not a list"),
    )]));
    let neg_size = pickle::to_bytes(&Value::dict(vec![(
        Value::str("segments"),
        Value::list(vec![Value::dict(vec![(
            Value::str("total_size"),
            Value::Int(-5),
        )])]),
    )]));
    let blocks_overflow = pickle::to_bytes(&Value::dict(vec![(
        Value::str("segments"),
        Value::list(vec![Value::dict(vec![
            (Value::str("total_size"), Value::Int(10)),
            (
                Value::str("blocks"),
                Value::list(vec![Value::dict(vec![(
                    Value::str("size"),
                    Value::Int(i64::MAX),
                )])]),
            ),
        ])]),
    )]));
    // One big trace referenced from many devices: the model would multiply it.
    let ev = Value::dict(vec![
        (Value::str("action"), Value::str("alloc")),
        (Value::str("addr"), Value::Int(4096)),
        (Value::str("size"), Value::Int(512)),
    ]);
    let trace = Value::list(vec![ev; 20_000]);
    let shared_trace = pickle::to_bytes(&Value::dict(vec![(
        Value::str("device_traces"),
        Value::list(vec![trace; 2_000]),
    )]));
    let mut msgpack_huge = vec![0x81, 0xa8];
    msgpack_huge.extend(b"segments");
    msgpack_huge.extend([0xdb, 0xff, 0xff, 0xff, 0xf0]);
    msgpack_huge.extend(b"abc");
    let mut msgpack_array = vec![0x81, 0xa8];
    msgpack_array.extend(b"segments");
    msgpack_array.extend([0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0]);
    let json_deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes();
    vec![
        ("deep nesting", deep, "deeper than"),
        ("deep tuples", deep_tuple, "deeper than"),
        ("3 GiB BINUNICODE8", huge_str8, "truncated"),
        ("4 GiB BINUNICODE", huge_x, "truncated"),
        ("memo ref out of range", memo_out, "memo slot 200"),
        ("memo ref far out of range", memo_far, "memo slot"),
        ("DUP/APPEND copies", dup_append, "copies shared containers"),
        ("billion laughs", laughs, "expected a segment dict"),
        ("100k gets of an open list", many_gets, "found a list"),
        (
            "wrong type in a known key",
            wrong_type,
            "segments: expected a list, found a string",
        ),
        ("negative size", neg_size, "total_size: negative"),
        (
            "blocks beyond their segment",
            blocks_overflow,
            "more than the segment",
        ),
        (
            "one trace shared by 2000 devices",
            shared_trace,
            "more entries than a file of this size",
        ),
        ("msgpack 4 GiB string", msgpack_huge, "msgpack"),
        ("msgpack 4G-entry array", msgpack_array, "msgpack"),
        ("JSON nested 100k deep", json_deep, "JSON"),
        ("empty", Vec::new(), "empty"),
        (
            "text garbage",
            b"hello world\n".to_vec(),
            "not a snapshot (found text starting",
        ),
    ]
}

#[test]
fn hostile_inputs_give_one_error_and_bounded_memory() {
    // Hand-made worst cases first: each is refused by the model with a clear reason.
    for (what, bytes, words) in worst_cases() {
        let errs = check(&bytes, what);
        assert!(!errs.is_empty(), "{what}: accepted");
        assert!(
            errs[0].contains(words),
            "{what}: error {:?} does not say {words:?}",
            errs[0]
        );
    }
    // Convert's check refuses the billion laughs before writing anything.
    let laughs = &worst_cases()[7].1;
    let v = read_bytes(laughs).unwrap();
    assert!(expanded_nodes(&v, 1 << 30) >= 1 << 30);

    // The mutation loop: deterministic seeds over real inputs of every kind.
    let corpus = corpus();
    let (mut cases, mut refused) = (0, 0);
    for (k, (name, bytes)) in corpus.iter().enumerate() {
        // The unmutated input is accepted.
        let errs = check(bytes, name);
        assert!(errs.is_empty(), "{name}: {errs:?}");
        let mut rng = fastrand::Rng::with_seed(0x5eed + k as u64);
        for i in 0..600 {
            let m = mutate(&mut rng, bytes);
            let errs = check(&m, &format!("{name} mutation {i}"));
            for e in &errs {
                assert!(!e.is_empty() && !e.contains('\n'), "{name} #{i}: {e:?}");
            }
            refused += usize::from(!errs.is_empty());
            cases += 1;
        }
    }
    assert!(cases >= 3000, "{cases} cases");
    // Most mutations of a structured file are caught as errors (the loop exercises them).
    assert!(refused * 4 >= cases, "only {refused} of {cases} refused");
}
