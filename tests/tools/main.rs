//! The offline side: the `cushim` command and the analyses on generated, hostile and real
//! snapshots and logs. One module per area; one test binary.

#[path = "../common/mod.rs"]
mod common;

mod analyze_cli;
mod analyze_export;
mod analyze_export_categories;
mod analyze_pytorch_fields;
mod analyze_real;
mod analyze_real_shapes;
mod analyze_report;
mod cli;
mod cli_help;
mod cli_run;
mod cli_signals;
mod log_reader_fuzz;
