//! Private PostgreSQL servers of a test on free loopback ports: a primary (`initdb`), streaming
//! standbys of it (`pg_basebackup -R`), and the faults a test plays on them (stop, start,
//! freeze with `SIGSTOP`: a server that accepts connections and never answers).
//!
//! PostgreSQL refuses to run as root, so every tool runs through `runuser -u postgres` when
//! the test runs as root. Dropping a server stops it (`-m immediate`).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// One private server (a primary or a standby).
#[derive(Debug)]
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    socket_dir: PathBuf,
    port: u16,
    running: bool,
}

fn error(message: String) -> std::io::Error {
    std::io::Error::other(message)
}

/// The newest installed server's binaries (`/usr/lib/postgresql/<version>/bin`).
fn bin_dir() -> std::io::Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| error("no PostgreSQL server binaries under /usr/lib/postgresql".into()))
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `tool args…`, as the postgres user when we are root; fails with the tool's stderr.
fn run(bin: &Path, tool: &str, args: &[&str]) -> std::io::Result<()> {
    let path = bin.join(tool);
    let mut cmd = if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(&path);
        cmd
    } else {
        Command::new(&path)
    };
    let out = cmd.args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(error(format!(
            "{tool} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// A directory the postgres user owns.
fn owned_dir(path: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(path)?;
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path)
            .status()?;
        if !status.success() {
            return Err(error(format!("cannot chown {}", path.display())));
        }
    }
    Ok(())
}

fn port_taken(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

impl Postgres {
    /// `initdb` under `dir` and start it, ready to stream to standbys.
    pub fn primary(dir: &Path) -> std::io::Result<Self> {
        let bin = bin_dir()?;
        owned_dir(dir)?;
        let data = dir.join("primary");
        let data_arg = data
            .to_str()
            .ok_or_else(|| error("non-UTF-8 path".into()))?;
        run(
            &bin,
            "initdb",
            &["-D", data_arg, "-A", "trust", "-U", "postgres", "--no-sync"],
        )?;
        let mut server = Self::at(bin, data, dir);
        server.start_on_free_port()?;
        Ok(server)
    }

    /// A streaming standby of this server under `dir`, started.
    pub fn standby(&self, dir: &Path) -> std::io::Result<Self> {
        owned_dir(dir)?;
        let data = dir.join("standby");
        let data_arg = data
            .to_str()
            .ok_or_else(|| error("non-UTF-8 path".into()))?;
        let port = self.port.to_string();
        run(
            &self.bin,
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                data_arg,
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",
                "--no-sync",
            ],
        )?;
        let mut server = Self::at(self.bin.clone(), data, dir);
        server.start_on_free_port()?;
        Ok(server)
    }

    fn at(bin: PathBuf, data: PathBuf, dir: &Path) -> Self {
        let name = data
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("pg")
            .to_owned();
        Self {
            bin,
            log: dir.join(format!("{name}.log")),
            socket_dir: dir.to_owned(),
            data,
            port: 0,
            running: false,
        }
    }

    fn start_on_free_port(&mut self) -> std::io::Result<()> {
        let mut last = error("no free port".into());
        for _ in 0..20 {
            let port = crate::ports::candidate(crate::ports::POSTGRES);
            if port_taken(port) {
                continue;
            }
            self.port = port;
            match self.start() {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Starts the server (again) on its port and waits until it accepts connections.
    pub fn start(&mut self) -> std::io::Result<()> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c wal_level=replica -c max_wal_senders=5 -c hot_standby=on -c fsync=off",
            self.port,
            self.socket_dir.display()
        );
        let (data, log) = (
            self.data.display().to_string(),
            self.log.display().to_string(),
        );
        run(
            &self.bin,
            "pg_ctl",
            &[
                "-D", &data, "-o", &options, "-l", &log, "-w", "-t", "60", "start",
            ],
        )?;
        self.running = true;
        Ok(())
    }

    /// Stops the server at once (`-m immediate`: as if it crashed).
    pub fn stop(&mut self) -> std::io::Result<()> {
        let data = self.data.display().to_string();
        run(
            &self.bin,
            "pg_ctl",
            &["-D", &data, "-m", "immediate", "stop"],
        )?;
        self.running = false;
        Ok(())
    }

    fn postmaster(&self) -> std::io::Result<i32> {
        let pid_file = std::fs::read_to_string(self.data.join("postmaster.pid"))?;
        pid_file
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| error("unreadable postmaster.pid".into()))
    }

    /// Every process the postmaster started.
    fn children(postmaster: i32) -> std::io::Result<Vec<i32>> {
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc")?.filter_map(Result::ok) {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // pid (comm) state ppid …; comm may hold spaces, so split after the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
        Ok(pids)
    }

    /// Signals the postmaster first, so that it forks no backend we would miss, then its
    /// children.
    fn signal_all(&self, signal: nix::sys::signal::Signal) -> std::io::Result<()> {
        let postmaster = self.postmaster()?;
        let send = |pid: i32| {
            // A backend that just exited is no error.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        };
        send(postmaster);
        Self::children(postmaster)?.into_iter().for_each(send);
        Ok(())
    }

    /// `SIGSTOP`s the server: the kernel still accepts connections, nobody answers.
    pub fn freeze(&self) -> std::io::Result<()> {
        self.signal_all(nix::sys::signal::Signal::SIGSTOP)
    }

    /// Resumes a frozen server.
    pub fn thaw(&self) -> std::io::Result<()> {
        self.signal_all(nix::sys::signal::Signal::SIGCONT)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `createdb NAME` on this server.
    pub fn create_database(&self, name: &str) -> std::io::Result<()> {
        let port = self.port.to_string();
        run(
            &self.bin,
            "createdb",
            &["-h", "127.0.0.1", "-p", &port, "-U", "postgres", name],
        )
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.running {
            let _ = self.thaw();
            let _ = self.stop();
        }
    }
}
