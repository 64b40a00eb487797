//! The `outcore` command line: the only crate with argument parsing and anyhow.

// The binary's job is printing results.
#![allow(clippy::print_stdout)]

mod args;
mod commands;
mod progress;

use clap::Parser;

fn main() {
    let argv = args::rewrite_knob_flags(std::env::args().collect());
    let cli = args::Cli::parse_from(argv);
    let stop = progress::StopFlag::install();
    if let Err(err) = commands::run(cli, &stop) {
        // One line, no backtrace: the chain of causes joined.
        let chain: Vec<String> = err.chain().map(|c| c.to_string()).collect();
        let mut line = String::new();
        for part in chain {
            if !line.contains(&part) {
                if !line.is_empty() {
                    line.push_str(": ");
                }
                line.push_str(&part);
            }
        }
        eprintln!("error: {line}");
        if stop.is_set() {
            std::process::exit(progress::INTERRUPTED_EXIT_CODE);
        }
        std::process::exit(1);
    }
}
