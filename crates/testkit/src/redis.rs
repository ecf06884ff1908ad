//! Throwaway Redis servers: one standalone, or a three-master Cluster, each on free loopback
//! ports, keeping nothing on disk.

use crate::Process;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long a starting server may take to answer before the attempt is abandoned.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// One `redis-server` child.
#[derive(Debug)]
pub struct RedisServer {
    process: Option<Process>,
    port: u16,
    dir: PathBuf,
    cluster: bool,
}

/// Whether a `PING` on `port` gets `+PONG`.
fn answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

impl RedisServer {
    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Process::pid)
    }

    /// Starts a standalone server; `dir` holds its log.
    pub fn start(dir: &Path) -> std::io::Result<Self> {
        Self::start_inner(dir, false)
    }

    fn start_inner(dir: &Path, cluster: bool) -> std::io::Result<Self> {
        for _ in 0..20 {
            let port = crate::ports::candidate(crate::ports::SERVERS);
            if answers(port) {
                continue;
            }
            let mut server = Self {
                process: None,
                port,
                dir: dir.join(format!("redis-{port}")),
                cluster,
            };
            if server.spawn()? {
                return Ok(server);
            }
        }
        Err(std::io::Error::other(
            "no free port for redis-server after 20 attempts",
        ))
    }

    /// Starts the child on `self.port`; false if it exited (port taken) before answering.
    fn spawn(&mut self) -> std::io::Result<bool> {
        std::fs::create_dir_all(&self.dir)?;
        let mut cmd = Command::new("redis-server");
        cmd.current_dir(&self.dir).args([
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            "redis.log",
        ]);
        if self.cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ]);
        }
        let mut process = Process::spawn(&format!("redis-{}", self.port), cmd)?;
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if answers(self.port) {
                self.process = Some(process);
                return Ok(true);
            }
            if process.has_exited() {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        process.kill();
        Ok(false)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs `redis-cli ARGS` against this server: its reply, one line per element (a Redis
    /// error is a reply line too). Panics if `redis-cli` cannot run: a test without it
    /// cannot go on.
    pub fn cli(&self, args: &[&str]) -> Vec<String> {
        let out = Command::new("redis-cli")
            .arg("-p")
            .arg(self.port.to_string())
            .args(args)
            .output()
            .expect("redis-cli runs (Debian package redis-tools)");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (an outage); data is gone.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing answers, as with a
    /// hung host. [`RedisServer::resume`] thaws it with its data.
    pub fn pause(&self) -> std::io::Result<()> {
        self.send(nix::sys::signal::Signal::SIGSTOP)
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) -> std::io::Result<()> {
        self.send(nix::sys::signal::Signal::SIGCONT)
    }

    fn send(&self, signal: nix::sys::signal::Signal) -> std::io::Result<()> {
        match &self.process {
            Some(process) => process.signal(signal),
            None => Err(std::io::Error::other("redis-server is not running")),
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.stop();
        let deadline = Instant::now() + START_TIMEOUT;
        // The port may linger a moment after the kill.
        while !self.spawn()? {
            if Instant::now() > deadline {
                return Err(std::io::Error::other("redis-server did not come back"));
            }
        }
        Ok(())
    }
}

/// Three masters, no replicas, slots spread by `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the nodes and joins them; returns once every node reports `cluster_state:ok`.
    pub fn start(dir: &Path) -> std::io::Result<Self> {
        let nodes = (0..3)
            .map(|_| RedisServer::start_inner(dir, true))
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        let deadline = Instant::now() + START_TIMEOUT;
        for node in &nodes {
            loop {
                let info = Command::new("redis-cli")
                    .args(["-p", &node.port.to_string(), "cluster", "info"])
                    .output()?;
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(std::io::Error::other("the cluster never became ok"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(Self { nodes })
    }

    /// `redis+cluster://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
}
