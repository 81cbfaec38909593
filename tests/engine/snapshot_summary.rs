//! `summary` figures from a snapshot with a known history, the same from every format;
//! `convert` keeps the content across formats.

use crate::common::snapshot_support as support;

use cushim::snapshot::build::build;
use cushim::snapshot::value::Value;
use cushim::snapshot::{encode, Format};
use cushim::trace::intern::StackTable;
use cushim_tools::analyze::summary::{devices, summary};
use cushim_tools::snapshot::convert::convert;
use cushim_tools::snapshot::reader::{read_bytes, read_file};
use std::sync::Arc;
use support::*;

#[test]
fn summary_reports_current_peak_fragmentation_and_sites() {
    let v = build(&fixture("enabled=all"), StackTable::global());
    let d = devices(&v).unwrap();
    assert_eq!(d.len(), 1, "device 1 has nothing on it and is left out");
    let (ord, s) = &d[0];
    assert_eq!(*ord, 0);
    assert_eq!(
        (s.segments, s.reserved, s.allocated, s.pending),
        (3, 24 * MIB, 11 * MIB / 2, MIB / 2)
    );
    assert_eq!(
        (s.peak_reserved, s.peak_allocated),
        (26 * MIB, 15 * MIB / 2)
    );
    assert_eq!(s.largest_free_block, 16 * MIB);
    assert!((s.fragmentation() - (1.0 - 5.5 / 24.0)).abs() < 1e-9);
    assert!(s.sites[0].0.contains("site_b"), "{:?}", s.sites);
    assert_eq!((s.sites[0].1, s.sites[0].2), (9 * MIB / 2, 2));
    assert!(s.sites[1].0.contains("site_a") && s.sites[1].1 == MIB);
    let text = summary(&v).unwrap();
    for want in [
        "device 0:",
        "allocated: 5.50 MiB (peak 7.50 MiB, ",
        "pending free: 0.50 MiB",
        "reserved:  24.00 MiB (peak 26.00 MiB, ",
        "fragmentation: 77.1%",
        "segments: 3",
        "largest free block: 16.00 MiB",
        "top allocation sites by live bytes (live at the end):",
        "top allocation sites by count (live at the end):",
        "top allocation sites at the trace's peak allocated (after event",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    assert!(
        !text.contains("device 1"),
        "empty device 1 is left out\n{text}"
    );
    assert!(
        text.contains("snapshot_support.rs:"),
        "sites show file:line\n{text}"
    );
}

#[test]
fn peak_comes_from_the_trace_not_only_the_final_state() {
    let mut input = fixture("enabled=all");
    input.devices[0].events.clear();
    let v = build(&input, StackTable::global());
    let s = &devices(&v).unwrap()[0].1;
    assert_eq!(
        (s.peak_allocated, s.peak_reserved),
        (s.allocated, s.reserved)
    );
}

#[test]
fn summary_is_the_same_from_every_format() {
    let v = build(&fixture("enabled=all"), StackTable::global());
    let want = summary(&v).unwrap();
    for f in [Format::Pickle, Format::Json, Format::Msgpack] {
        let back = read_bytes(&encode(&v, f).unwrap()).unwrap();
        assert_eq!(summary(&back).unwrap(), want, "{f:?}");
    }
}

fn normalize(v: &Value) -> Value {
    match v {
        Value::Tuple(t) | Value::List(t) => {
            Value::List(Arc::new(t.iter().map(normalize).collect()))
        }
        Value::Dict(d) => {
            let mut e: Vec<(Value, Value)> = d
                .iter()
                .map(|(k, x)| (normalize(k), normalize(x)))
                .collect();
            e.sort_by(|a, b| format!("{:?}", a.0).cmp(&format!("{:?}", b.0)));
            Value::dict(e)
        }
        other => other.clone(),
    }
}

#[test]
fn convert_round_trips_pickle_json_msgpack_pickle() {
    let dir = scratch("convert");
    let v = build(&fixture("enabled=all"), StackTable::global());
    let p0 = dir.join("a.pickle");
    std::fs::write(&p0, encode(&v, Format::Pickle).unwrap()).unwrap();
    assert_eq!(
        convert(&p0, &dir.join("b.json"), None).unwrap(),
        Format::Json
    );
    assert_eq!(
        convert(&dir.join("b.json"), &dir.join("c.msgpack"), None).unwrap(),
        Format::Msgpack
    );
    assert_eq!(
        convert(
            &dir.join("c.msgpack"),
            &dir.join("d.out"),
            Some(Format::Pickle)
        )
        .unwrap(),
        Format::Pickle
    );
    let back = read_file(&dir.join("d.out")).unwrap();
    assert!(
        normalize(&back) == normalize(&v.expanded()),
        "content survives the chain"
    );
    for f in ["b.json", "d.out"] {
        let (ok, out) = python_check(&dir.join(f), &["--expect-frame", "site_a"]);
        assert!(ok, "{f}: {out}");
    }
    let e = convert(&dir.join("missing.pickle"), &dir.join("x.json"), None).unwrap_err();
    assert!(e.contains("missing.pickle"), "{e}");
}
