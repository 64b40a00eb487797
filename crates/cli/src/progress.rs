//! Progress on a terminal and a clean Ctrl-C for long commands.
//!
//! The first Ctrl-C asks the running command to stop at its next safe point
//! (between iterations of `run`, between planners of `compare`): it stops,
//! writes nothing, and the process exits with 130, the shell's code for an
//! interrupt. A second Ctrl-C quits at once. Bars are drawn on stderr only
//! when stderr is a terminal (indicatif hides them otherwise), so piped and
//! JSON output are unchanged.

use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The exit code of a command stopped by Ctrl-C.
pub const INTERRUPTED_EXIT_CODE: i32 = 130;

/// Whether the user asked to stop; shared with the Ctrl-C handler.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// Installs the Ctrl-C handler. If a handler cannot be installed the
    /// default remains (Ctrl-C ends the process at once), which loses nothing
    /// either: no command writes its output before it has finished.
    pub fn install() -> StopFlag {
        let flag = StopFlag::default();
        let inner = flag.0.clone();
        let _ = ctrlc::set_handler(move || {
            if inner.swap(true, Ordering::SeqCst) {
                eprintln!("\ninterrupted again: quitting now");
                std::process::exit(INTERRUPTED_EXIT_CODE);
            }
            eprintln!(
                "\ninterrupt: stopping at the next safe point, nothing will be written (Ctrl-C again to quit now)"
            );
        });
        flag
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A bar over `total` units named `what`, hidden when stderr is not a terminal.
pub fn bar(what: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} ({elapsed}, ETA {eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// A spinner with `what` and the time elapsed, for one long call that reports
/// no steps of its own (a planner's search); hidden when stderr is not a
/// terminal. Clear it with `finish_and_clear`.
pub fn spinner(what: String) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.set_message(what);
    bar.enable_steady_tick(std::time::Duration::from_millis(250));
    bar
}

/// The executor's per-iteration hook: advances `bar` and asks to stop once the
/// flag is set. A run that starts over (the reference run after the measured
/// one) restarts the bar.
pub fn iteration_hook(bar: ProgressBar, stop: StopFlag) -> outcore::ProgressHook {
    outcore::ProgressHook(Arc::new(move |done, asked| {
        if u64::from(asked) != bar.length().unwrap_or(0) || u64::from(done) < bar.position() {
            bar.set_length(u64::from(asked));
            bar.reset();
        }
        bar.set_position(u64::from(done));
        if done >= asked {
            bar.finish_and_clear();
        }
        !stop.is_set()
    }))
}
