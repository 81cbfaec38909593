//! The FX node a frame of compiled code ran, as the allocation's site.
//!
//! What PyTorch records: `torch.cuda.memory._snapshot(augment_with_fx_traces=True)` (and
//! `_dump_snapshot(..., augment_with_fx_traces=True)`; torch.fx's
//! `_augment_memory_snapshot_stack_traces`) looks up every frame whose file is a module
//! torch.fx generated for a graph (`fx_generated_*.py`) in the registry filled while the
//! graphs were compiled, and adds to that frame `fx_node_op` (`call_function`, ...),
//! `fx_node_name` (`addmm`, `relu`, `addmm_1`), `fx_node_target` (`aten.addmm.default`) and,
//! when the node has one, `fx_original_trace`: the node's source stack as Python prints a
//! traceback (`File "model.py", line 12, in forward` then the source line, outermost
//! first).
//!
//! Policy: the generated frame only says "line 7 of a module torch.fx wrote"; the node says
//! which operation of the model made the memory, and its original trace says where in the
//! model it came from. So a frame with `fx_node_name` gets a frame of its own just inside
//! it (innermost first), named `NODE [fx OP TARGET]`, at the original trace's innermost
//! line of the program (a line of a framework's own Python when the trace has no line of
//! the program, the generated module's line when there is no trace): that frame is the
//! program's, so it is the site (`summary`, `--by site`, the categories' top sites), and
//! the generated frame and every Python frame stay in the stack behind it (`--depth`,
//! `--tree`). A frame with an FX node ran in a torch.compile graph: its allocation is
//! compiled code to the categories (`category_rules`).

use crate::analyze::frames::{classify, Class};
use crate::analyze::model::Frame;
use cushim::snapshot::value::Value;
use std::sync::Arc;

/// What an FX node frame's name carries after the node's name (the categories' rule).
pub const FX_TAG: &str = " [fx ";

/// The frame of the FX node frame `f` (a frame dict) names, given `f` as a frame (`own`);
/// `None` when `f` carries no `fx_node_name`.
pub fn node_frame(f: &Value, own: &Frame) -> Option<Frame> {
    let name = f.get("fx_node_name").and_then(Value::as_str)?;
    let op = f.get("fx_node_op").and_then(Value::as_str).unwrap_or("");
    let target = f
        .get("fx_node_target")
        .and_then(Value::as_str)
        .unwrap_or("");
    let what = [op, target]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    let label = if what.is_empty() {
        format!("{name}{}]", FX_TAG.trim_end())
    } else {
        format!("{name}{FX_TAG}{what}]")
    };
    let lines = f
        .get("fx_original_trace")
        .and_then(Value::as_str)
        .map(trace_lines)
        .unwrap_or_default();
    // Innermost first: the program's line, else a framework's, else the generated one.
    let at = lines
        .iter()
        .rev()
        .find(|l| classify(l) == Class::Program)
        .or_else(|| lines.last());
    let (file, line) = match at {
        Some(l) => (l.file.clone(), l.line),
        None => (own.file.clone(), own.line),
    };
    Some(Frame {
        name: Arc::from(label),
        file,
        line,
    })
}

/// The `File "X", line N, in F` lines of a Python traceback, outermost first.
fn trace_lines(trace: &str) -> Vec<Frame> {
    trace
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix("File \"")?;
            let (file, rest) = rest.split_once('"')?;
            let rest = rest.trim_start_matches(',').trim_start();
            let rest = rest.strip_prefix("line ")?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let line = digits.parse().ok()?;
            let func = rest.split_once(" in ").map(|(_, f)| f.trim()).unwrap_or("");
            Some(Frame {
                name: Arc::from(func),
                file: Arc::from(file),
                line,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> Frame {
        Frame {
            name: Arc::from("forward"),
            file: Arc::from("/tmp/x/fx_generated_abc.py"),
            line: 7,
        }
    }

    #[test]
    fn the_node_frame_is_at_the_models_line_of_its_original_trace() {
        let f = Value::from_json(&serde_json::json!({
            "filename": "/tmp/x/fx_generated_abc.py", "line": 7, "name": "forward",
            "fx_node_op": "call_function", "fx_node_name": "addmm",
            "fx_node_target": "aten.addmm.default",
            "fx_original_trace": "  File \"/work/train.py\", line 40, in step\n    out = model(x)\n  File \"/work/model.py\", line 12, in forward\n    a = self.net1(x)\n  File \"/usr/lib/python3/site-packages/torch/nn/modules/linear.py\", line 125, in forward\n    return F.linear(input, self.weight, self.bias)\n"
        }));
        let n = node_frame(&f, &own()).unwrap();
        assert_eq!(&*n.name, "addmm [fx call_function aten.addmm.default]");
        assert_eq!((&*n.file, n.line), ("/work/model.py", 12));
    }

    #[test]
    fn without_an_original_trace_the_node_is_at_the_generated_line() {
        let f = Value::from_json(&serde_json::json!({
            "filename": "/tmp/x/fx_generated_abc.py", "line": 7, "name": "forward",
            "fx_node_op": "call_function", "fx_node_name": "relu", "fx_node_target": "aten.relu.default"
        }));
        let n = node_frame(&f, &own()).unwrap();
        assert_eq!((&*n.file, n.line), ("/tmp/x/fx_generated_abc.py", 7));
        let plain =
            Value::from_json(&serde_json::json!({"filename": "a.py", "line": 1, "name": "f"}));
        assert!(node_frame(&plain, &own()).is_none());
    }
}
