//! A child process owned by a test.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// A child process whose stdout lines can be awaited; killed on drop.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    lines: Receiver<String>,
}

impl Process {
    /// Starts `cmd` with stdout captured (and echoed to stderr with a `[name]` prefix, so a
    /// failing test shows it) and stderr inherited.
    pub fn spawn(name: &str, mut cmd: Command) -> std::io::Result<Self> {
        let mut child = cmd.stdout(Stdio::piped()).stdin(Stdio::null()).spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("stdout was not captured"))?;
        let (tx, lines) = channel();
        let tag = name.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("[{tag}] {line}");
                if tx.send(line).is_err() {
                    // Nobody listens any more; keep draining so the child never blocks.
                    continue;
                }
            }
        });
        Ok(Self {
            name: name.to_owned(),
            child,
            lines,
        })
    }

    /// Waits for a stdout line starting with `prefix` and returns it. `timeout` only guards
    /// against a child that hangs; it is not a performance assertion.
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "{}: no line {prefix:?} within {timeout:?}",
                        self.name
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.try_wait().ok().flatten();
                    return Err(format!(
                        "{}: exited ({status:?}) before printing {prefix:?}",
                        self.name
                    ));
                }
            }
        }
    }

    /// Whether the child has exited.
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGKILL and reaps the child: a crash, with no chance to clean up.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the child to exit.
    pub fn terminate(&mut self) -> std::io::Result<ExitStatus> {
        self.signal(Signal::SIGTERM)?;
        self.child.wait()
    }

    /// Sends a signal without waiting.
    pub fn signal(&self, signal: Signal) -> std::io::Result<()> {
        let pid = i32::try_from(self.child.id()).map_err(std::io::Error::other)?;
        kill(Pid::from_raw(pid), signal).map_err(std::io::Error::from)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}
