//! Snapshots in all three formats: same content, loadable by Python's standard library,
//! schema-correct, replayable backwards, and in the restricted pickle dialect.

use crate::common::snapshot_support as support;

use cushim::snapshot::build::build;
use cushim::snapshot::value::Value;
use cushim::snapshot::{encode, Format};
use cushim::trace::intern::StackTable;
use cushim_tools::snapshot::reader;
use std::process::Command;
use std::sync::Arc;
use support::*;

const FULL: &str = "enabled=all,context=all,stacks=native";

/// Tuples become lists and key order may change in JSON and msgpack: compare modulo that.
fn untuple(v: &Value) -> Value {
    match v {
        Value::Tuple(t) | Value::List(t) => Value::List(Arc::new(t.iter().map(untuple).collect())),
        Value::Dict(d) => {
            let mut e: Vec<(Value, Value)> =
                d.iter().map(|(k, x)| (untuple(k), untuple(x))).collect();
            e.sort_by(|a, b| format!("{:?}", a.0).cmp(&format!("{:?}", b.0)));
            Value::dict(e)
        }
        other => other.clone(),
    }
}

#[test]
fn all_three_formats_round_trip_to_the_same_content() {
    let v = build(&fixture(FULL), StackTable::global());
    let p = reader::read_bytes(&encode(&v, Format::Pickle).unwrap()).unwrap();
    let v_plain = v.expanded();
    assert!(
        v_plain.get("device_traces").is_some(),
        "expanded tree is inspectable"
    );
    assert!(p == v_plain, "pickle round trip is exact, tuples included");
    for f in [Format::Json, Format::Msgpack] {
        let bytes = encode(&v, f).unwrap();
        assert_eq!(reader::detect(&bytes), f);
        let back = reader::read_bytes(&bytes).unwrap();
        assert!(untuple(&back) == untuple(&v_plain), "{f:?} differs");
        let seg = &back.get("segments").unwrap().as_seq().unwrap()[0];
        assert!(
            matches!(seg.get("segment_pool_id"), Some(Value::Tuple(_))),
            "{f:?}: pool id is a tuple again"
        );
    }
}

#[test]
fn python_loads_pickle_and_json_and_both_pass_schema_and_backward_replay() {
    let dir = scratch("py-load");
    let v = build(&fixture(FULL), StackTable::global());
    let mut facts = Vec::new();
    for (name, f) in [("s.pickle", Format::Pickle), ("s.json", Format::Json)] {
        let path = dir.join(name);
        std::fs::write(&path, encode(&v, f).unwrap()).unwrap();
        let (ok, out) = python_check(
            &path,
            &["--expect-frame", "site_a", "--expect-frame", "site_b"],
        );
        assert!(ok, "{name}: {out}");
        let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(j["devices"], 2, "device 1 has an (empty) trace list: {out}");
        assert_eq!(j["events"], serde_json::json!([20, 0]));
        assert_eq!(j["expandable"], true);
        facts.push(j);
    }
    assert_eq!(facts[0]["actions"], facts[1]["actions"]);
    let actions = facts[0]["actions"].to_string();
    for a in ["segment_map", "segment_unmap", "oom", "free_completed"] {
        assert!(actions.contains(a), "{actions}");
    }
}

#[test]
fn python_sees_each_distinct_stack_as_one_shared_frame_list() {
    let dir = scratch("py-share");
    let v = build(&fixture(FULL), StackTable::global());
    let path = dir.join("s.pickle");
    std::fs::write(&path, encode(&v, Format::Pickle).unwrap()).unwrap();
    let (ok, out) = python_check(&path, &[]);
    assert!(ok, "{out}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    // The fixture's events come from two call sites: two list objects after unpickling.
    assert_eq!(j["distinct_trace_frame_lists"], 2, "{out}");
}

#[test]
fn checker_rejects_a_trace_that_contradicts_the_segments() {
    let dir = scratch("py-reject");
    let mut input = fixture(FULL);
    // Drop the last free_requested: the pending-free block no longer matches the history.
    input.devices[0].events.pop();
    let path = dir.join("bad.pickle");
    std::fs::write(
        &path,
        encode(&build(&input, StackTable::global()), Format::Pickle).unwrap(),
    )
    .unwrap();
    let (ok, out) = python_check(&path, &[]);
    assert!(!ok && out.contains("0x7f0000100000"), "{out}");
    // And blocks that do not sum to the segment.
    let mut input = fixture(FULL);
    input.devices[0].segments[1].blocks.pop();
    input.devices[0].segments[1].total_size = 20 * MIB;
    std::fs::write(
        &path,
        encode(&build(&input, StackTable::global()), Format::Pickle).unwrap(),
    )
    .unwrap();
    let (ok, out) = python_check(&path, &[]);
    assert!(!ok && out.contains("sum"), "{out}");
}

#[test]
fn pickle_is_protocol_4_with_only_plain_data_opcodes() {
    let dir = scratch("opcodes");
    let v = build(&fixture(FULL), StackTable::global());
    let path = dir.join("s.pickle");
    std::fs::write(&path, encode(&v, Format::Pickle).unwrap()).unwrap();
    let script = r#"
import pickletools, sys
ops = {op.name for op, arg, pos in pickletools.genops(open(sys.argv[1], 'rb'))}
first = next(pickletools.genops(open(sys.argv[1], 'rb')))
print(first[1]); print(' '.join(sorted(ops)))
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("4"), "PROTO 4");
    let allowed = [
        "PROTO",
        "STOP",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG1",
        "BINFLOAT",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "EMPTY_LIST",
        "EMPTY_DICT",
        "EMPTY_TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "TUPLE",
        "MARK",
        "APPEND",
        "APPENDS",
        "SETITEM",
        "SETITEMS",
        "MEMOIZE",
        "BINGET",
        "LONG_BINGET",
    ];
    let ops: Vec<&str> = lines.next().unwrap().split(' ').collect();
    for op in &ops {
        assert!(allowed.contains(op), "opcode {op} outside the dialect");
    }
    for needed in ["MEMOIZE", "BINGET", "TUPLE2"] {
        assert!(ops.contains(&needed), "{needed} missing from {ops:?}");
    }
}

#[test]
fn oom_entries_carry_device_free_instead_of_addr() {
    let v = build(&fixture(FULL), StackTable::global()).expanded();
    let trace = v.get("device_traces").unwrap().as_seq().unwrap()[0]
        .as_seq()
        .unwrap();
    let oom = trace
        .iter()
        .find(|e| e.get("action").unwrap().as_str() == Some("oom"))
        .unwrap();
    assert_eq!(
        oom.get("device_free").unwrap().as_i64(),
        Some((123 * MIB) as i64)
    );
    assert!(oom.get("addr").is_none());
    assert!(trace
        .iter()
        .filter(|e| e.get("action").unwrap().as_str() != Some("oom"))
        .all(|e| e.get("addr").is_some()));
}

#[test]
fn top_level_carries_settings_and_cushim_metadata() {
    let v = build(&fixture(FULL), StackTable::global()).expanded();
    assert_eq!(
        v.get("allocator_settings")
            .unwrap()
            .get("max_split_size")
            .unwrap()
            .as_i64(),
        Some(-1)
    );
    let c = v.get("cushim").unwrap();
    assert!(c.get("version").unwrap().as_str().is_some());
    assert_eq!(
        c.get("commit").unwrap().as_str(),
        Some(cushim::version::COMMIT),
        "the snapshot names the commit the engine was built from"
    );
    assert_eq!(c.get("cmdline").unwrap().as_seq().unwrap().len(), 2);
    assert_eq!(
        c.get("stats").unwrap().get("num_ooms").unwrap().as_i64(),
        Some(1)
    );
    assert!(
        v.get("host_segments").is_none(),
        "no pinned part unless given"
    );
}

fn frames_of(v: &Value) -> usize {
    v.get("frames").unwrap().as_seq().unwrap().len()
}

#[test]
fn enabled_state_records_no_history_but_blocks_carry_stacks() {
    let v = build(&fixture("enabled=state"), StackTable::global()).expanded();
    let traces = v.get("device_traces").unwrap().as_seq().unwrap();
    assert!(traces.iter().all(|t| t.as_seq().unwrap().is_empty()));
    let seg = &v.get("segments").unwrap().as_seq().unwrap()[0];
    let blocks = seg.get("blocks").unwrap().as_seq().unwrap();
    assert!(
        frames_of(&blocks[1]) > 0,
        "active block has its allocation stack"
    );
    assert!(frames_of(seg) > 0);
}

#[test]
fn context_decides_which_entries_carry_frames() {
    let count = |h: &str| {
        let v = build(&fixture(h), StackTable::global()).expanded();
        let t = v.get("device_traces").unwrap().as_seq().unwrap()[0]
            .as_seq()
            .unwrap()
            .to_vec();
        let with = |act: &str| {
            t.iter()
                .filter(|e| e.get("action").unwrap().as_str() == Some(act))
                .all(|e| frames_of(e) > 0)
        };
        let without = |act: &str| {
            t.iter()
                .filter(|e| e.get("action").unwrap().as_str() == Some(act))
                .all(|e| frames_of(e) == 0)
        };
        let blocks = v.get("segments").unwrap().as_seq().unwrap()[1]
            .get("blocks")
            .unwrap()
            .as_seq()
            .unwrap()
            .to_vec();
        (
            with("alloc"),
            with("free_completed"),
            without("free_completed"),
            without("alloc"),
            frames_of(&blocks[0]) > 0,
        )
    };
    assert_eq!(
        count("enabled=all,context=all"),
        (true, true, false, false, true)
    );
    assert_eq!(
        count("enabled=all,context=alloc"),
        (true, false, true, false, true)
    );
    assert_eq!(
        count("enabled=all,context=state"),
        (false, false, true, true, true)
    );
    assert_eq!(
        count("enabled=all,context=none"),
        (false, false, true, true, false)
    );
    assert_eq!(
        count("enabled=all,stacks=none"),
        (false, false, true, true, false)
    );
}

#[test]
fn skip_actions_leave_those_events_out_of_the_snapshot() {
    let v = build(
        &fixture("enabled=all,skip_actions=free_requested;oom"),
        StackTable::global(),
    )
    .expanded();
    let t = v.get("device_traces").unwrap().as_seq().unwrap()[0]
        .as_seq()
        .unwrap();
    assert_eq!(t.len(), 20 - 4 - 1);
    assert!(t.iter().all(|e| !matches!(
        e.get("action").unwrap().as_str(),
        Some("free_requested" | "oom")
    )));
}

#[test]
fn device_traces_has_one_list_per_ordinal_even_when_a_device_is_missing() {
    let mut input = fixture(FULL);
    input.devices[1].device = 3;
    let v = build(&input, StackTable::global()).expanded();
    let traces = v.get("device_traces").unwrap().as_seq().unwrap();
    assert_eq!(traces.len(), 4);
    assert!(traces[1..].iter().all(|t| t.as_seq().unwrap().is_empty()));
}

#[test]
fn pinned_host_part_is_written_when_given() {
    let mut input = fixture(FULL);
    let mut seg = input.devices[0].segments[0].clone();
    seg.device = -1;
    input.host = Some((vec![seg], Vec::new()));
    let v = build(&input, StackTable::global()).expanded();
    assert_eq!(v.get("host_segments").unwrap().as_seq().unwrap().len(), 1);
    assert!(v.get("host_traces").unwrap().as_seq().unwrap().is_empty());
}
