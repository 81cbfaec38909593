//! fork under the shim (issue 14, item 1): a parent whose threads allocate forks 30 times;
//! no child hangs (each is waited for with a deadline and killed past it), every child's
//! snapshot goes to its own `%p` file and parses, and the parent's figures are those of its
//! own calls.
mod common;

use std::path::Path;

const HISTORY: &str = "enabled=all,context=all,stacks=native,max_entries=4000";

fn forks_leave_no_child_hung(mode: &str, name: &str) {
    let exe = common::compile("shim_fork", &[]);
    let dir = common::scratch(name);
    let out = common::run_ok(
        common::shim_cmd(&exe)
            .args([mode, "30"])
            .env("CUSHIM_SNAPSHOT", dir.join("snap-%p.pickle"))
            .env("CUSHIM_HISTORY", HISTORY),
    );
    let kv = common::kv(&out);
    assert_eq!(common::num(&kv, "ok"), 30, "{out}");
    assert_eq!(common::num(&kv, "hung"), 0, "{out}");
    // The parent's figures: every cudaMalloc it made counted once, none still allocated.
    assert_eq!(
        common::num(&kv, "shim_allocs"),
        common::num(&kv, "mallocs"),
        "{out}"
    );
    assert_eq!(common::num(&kv, "shim_allocated"), 0, "{out}");
    let pids: Vec<&str> = kv["pids"].split(',').collect();
    assert_eq!(pids.len(), 30);
    for pid in pids {
        let snap = dir.join(format!("snap-{pid}.pickle"));
        check_snapshot(&snap);
    }
}

fn check_snapshot(snap: &Path) {
    assert!(snap.exists(), "no snapshot {}", snap.display());
    let v = common::load_snapshot_counts(snap);
    assert!(v["segments"].is_u64(), "{}: {v}", snap.display());
}

#[test]
fn thirty_children_that_exit_at_once_while_threads_allocate_all_exit_and_dump() {
    forks_leave_no_child_hung("exit", "fork-exit");
}

#[test]
fn thirty_children_that_allocate_free_and_dump_all_exit_with_their_own_snapshots() {
    forks_leave_no_child_hung("alloc", "fork-alloc");
}
