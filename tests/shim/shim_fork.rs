//! fork under the shim: a parent whose threads allocate forks 30 times;
//! no child hangs (each is waited for with a deadline and killed past it), every child's
//! snapshot goes to its own `%p` file and parses, and the parent's figures are those of its
//! own calls.
use crate::common;

/// Native stacks: the children's snapshots read the stack table a parent thread may have
/// been interning into at the fork.
const WITH_STACKS: &str = "enabled=all,context=all,stacks=native,max_entries=4000";
/// Events without stacks: each child's snapshot then costs no symbolization (about 0.2 s of
/// debug-info loading per process), which would dominate a second run of 30 children.
const WITHOUT_STACKS: &str = "enabled=all,stacks=none,max_entries=4000";

/// `cushim_mode`: `CUSHIM_MODE` (`cache`, or `observe`: every call recorded in the
/// observed-allocation tables instead of the cache).
fn forks_leave_no_child_hung(mode: &str, name: &str, history: &str, cushim_mode: &str) {
    let exe = common::compile("shim_fork", &[]);
    let dir = common::scratch(name);
    let out = common::run_ok(
        common::shim_cmd(&exe)
            .args([mode, "30"])
            .env("CUSHIM_SNAPSHOT", dir.join("snap-%p.pickle"))
            .env("CUSHIM_HISTORY", history)
            .env("CUSHIM_MODE", cushim_mode)
            // A child that exits at once makes no CUDA call of its own: any call there is the
            // shim's, which could wait for ever on a driver lock held at the fork by a parent
            // thread (CUDA leaves use after `fork` undefined). simcuda ends such a child.
            .env(
                "SIMCUDA_AFTER_FORK",
                if mode == "exit" { "exit" } else { "" },
            ),
    );
    let kv = common::kv(&out);
    assert_eq!(common::num(&kv, "ok"), 30, "{out}");
    assert_eq!(common::num(&kv, "hung"), 0, "{out}");
    assert_eq!(common::num(&kv, "failed"), 0, "{out}");
    if cushim_mode == "cache" {
        // The parent's figures: every cudaMalloc it made counted once, none still
        // allocated.
        assert_eq!(
            common::num(&kv, "shim_allocs"),
            common::num(&kv, "mallocs"),
            "{out}"
        );
        assert_eq!(common::num(&kv, "shim_allocated"), 0, "{out}");
    }
    let pids: Vec<&str> = kv["pids"].split(',').collect();
    assert_eq!(pids.len(), 30);
    for (i, pid) in pids.iter().enumerate() {
        let snap = dir.join(format!("snap-{pid}.pickle"));
        assert!(snap.exists(), "no snapshot {}", snap.display());
        // Every child's file parses (cushim's reader); one also through Python, as the
        // viewer reads it (Python's start-up per file would dominate the test's time).
        if let Err(e) = cushim_tools::snapshot::reader::read_file(&snap) {
            panic!("{}: {e}", snap.display());
        }
        if i == 0 {
            let counts = common::load_snapshot_counts(&snap);
            assert!(counts["segments"].is_u64(), "{}: {counts}", snap.display());
        }
    }
}

#[test]
fn thirty_children_that_exit_at_once_while_threads_allocate_all_exit_and_dump() {
    forks_leave_no_child_hung("exit", "fork-exit", WITH_STACKS, "cache");
}

#[test]
fn thirty_children_that_allocate_free_and_dump_all_exit_with_their_own_snapshots() {
    forks_leave_no_child_hung("alloc", "fork-alloc", WITHOUT_STACKS, "cache");
}

/// Observing: the parent's threads are inside the observed tables (not the cache) when it
/// forks, and each child's exit snapshot reads those tables; the fork handlers hold their
/// locks too, so no child waits on one. (Children that allocate would call the real driver
/// at once, whose use after `fork` CUDA leaves undefined: simcuda's own locks may be held.)
#[test]
fn thirty_observing_children_that_exit_at_once_all_exit_and_dump() {
    forks_leave_no_child_hung("exit", "fork-observe", WITHOUT_STACKS, "observe");
}
