//! The `outcore` command line: the only crate with argument parsing and anyhow.

// The binary's job is printing results.
#![allow(clippy::print_stdout)]

mod args;
mod commands;
mod progress;

use clap::{CommandFactory, FromArgMatches};

fn main() {
    let argv = args::rewrite_knob_flags(std::env::args().collect());
    // A negative number is a value, so that `--seconds -1` gets the range
    // check that names the accepted values, not clap's "unexpected argument
    // '-1'" (no option here is a digit, so nothing else parses otherwise).
    let command = args::Cli::command().mut_subcommands(|c| c.allow_negative_numbers(true));
    let cli =
        args::Cli::from_arg_matches(&command.get_matches_from(argv)).unwrap_or_else(|e| e.exit());
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
