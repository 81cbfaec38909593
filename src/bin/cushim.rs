//! The `cushim` command.

fn main() {
    eprintln!("cushim: no subcommands yet");
    std::process::exit(2);
}
