//! The live progress line of `flotilla train` on an interactive terminal: env steps against the budget, steps
//! per second, ETA, the last evaluation and, for distributed runs, the actors connected and the policy lag.
//!
//! Drawn only when stderr is a terminal (and `FLOTILLA_PROGRESS` is not `0`); log lines then print above it
//! (the log writer suspends the line while it writes). Elsewhere (CI, files, pipes) nothing changes: the same
//! log lines, no control characters.
use std::io::{IsTerminal, Write};
use std::sync::OnceLock;
use std::time::Duration;

use flotilla_learner::progress::LogRow;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The line, once a training loop in this process has logged its first row.
static BAR: OnceLock<ProgressBar> = OnceLock::new();

/// The environment variable that turns the line off (`0`) or leaves it on (`1`, or unset).
const PROGRESS_VAR: &str = "FLOTILLA_PROGRESS";

/// Whether `FLOTILLA_PROGRESS` allows the line; a value other than `0` or `1` is an error naming it (the
/// command line asks first, to refuse it before anything runs).
pub fn allowed() -> anyhow::Result<bool> {
    static ON: OnceLock<Result<bool, String>> = OnceLock::new();
    ON.get_or_init(|| parse(std::env::var(PROGRESS_VAR).ok().as_deref())).clone().map_err(anyhow::Error::msg)
}

fn parse(value: Option<&str>) -> Result<bool, String> {
    flotilla_core::parse_switch(PROGRESS_VAR, value, true, "draw the progress line")
}

/// Whether this process draws a progress line: stderr is a terminal and `FLOTILLA_PROGRESS` is not `0`.
pub fn enabled() -> bool {
    std::io::stderr().is_terminal() && allowed().unwrap_or(false)
}

/// Show a logged row on the line (created at the first row, `total` env steps long).
pub fn update(row: &LogRow, total: u64) {
    if !enabled() {
        return;
    }
    let bar = BAR.get_or_init(|| {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(5));
        let style = ProgressStyle::with_template(
            "{spinner} {elapsed_precise} [{bar:25}] {human_pos}/{human_len} env steps · {msg} · ETA {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> ");
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    });
    bar.set_length(total);
    bar.set_position(row.env_steps.min(total));
    bar.set_message(message(row));
}

/// Clear the line at the end of a run (the summary prints after it).
pub fn finish() {
    if let Some(bar) = BAR.get() {
        bar.finish_and_clear();
    }
}

/// `12,345 sps · eval 487.2 · 4 actors · lag 1.2`: what the row says, the parts it has.
fn message(row: &LogRow) -> String {
    let mut parts = vec![format!("{:.0} sps", row.sps)];
    if let Some(e) = &row.eval {
        parts.push(format!("eval {:.1}", e.mean()));
    } else if let Some(r) = row.episodic_return {
        parts.push(format!("return {r:.1}"));
    }
    if let Some(actors) = row.update.get("charts/actors") {
        parts.push(format!("{actors:.0} actors"));
    }
    if let Some(lag) = row.update.get("charts/policy_lag") {
        parts.push(format!("lag {lag:.1}"));
    }
    parts.join(" · ")
}

/// The log's writer: stderr, with the progress line (if drawn) cleared while a log line is written and redrawn
/// after it.
pub struct LogWriter {
    buf: Vec<u8>,
}

impl Write for LogWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let buf = std::mem::take(&mut self.buf);
        match BAR.get() {
            Some(bar) => bar.suspend(|| std::io::stderr().write_all(&buf)),
            None => std::io::stderr().write_all(&buf),
        }
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// `tracing_subscriber`'s writer factory: one [`LogWriter`] per log event.
pub fn log_writer() -> LogWriter {
    LogWriter { buf: Vec::new() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_progress_variable_is_0_or_1_and_anything_else_is_refused_by_name() {
        assert_eq!(super::parse(None), Ok(true));
        assert_eq!(super::parse(Some("1")), Ok(true));
        assert_eq!(super::parse(Some(" 0 ")), Ok(false));
        let err = super::parse(Some("false")).unwrap_err();
        assert!(err.contains("FLOTILLA_PROGRESS=\"false\"") && err.contains("progress line"), "{err}");
    }
}
