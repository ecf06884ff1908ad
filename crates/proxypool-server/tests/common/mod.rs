//! The test lab: real tinyproxy and dante processes on loopback, each leaving from its own
//! 127.0.0.x address, a target HTTP server of our own, and the `proxypool` binary.
//! Everything started here is killed on drop.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::net::{IpAddr, SocketAddr, TcpListener as StdListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use testkit::Process;

/// Panics with the install line when a Debian package's program is missing.
pub fn require(program: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{program} is missing: run scripts/test (it installs it) or apt-get install -y {package}"
    );
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A tinyproxy whose outgoing connections leave from `bind`.
pub struct Tinyproxy {
    pub port: u16,
    pub bind: String,
    conf: PathBuf,
    process: Option<Process>,
}

impl Tinyproxy {
    pub fn start(dir: &Path, bind: &str) -> Self {
        require("tinyproxy", "tinyproxy");
        let port = testkit::free_port("127.0.0.1");
        let conf = dir.join(format!("tinyproxy-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nBind {bind}\nAllow 127.0.0.1\nTimeout 30\nLogLevel Error\nMaxClients 512\n"
            ),
        )
        .unwrap();
        let mut t = Self {
            port,
            bind: bind.to_owned(),
            conf,
            process: None,
        };
        t.restart();
        t
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// Starts it (again) on the same port.
    pub fn restart(&mut self) {
        let mut cmd = Command::new("tinyproxy");
        cmd.arg("-d").arg("-c").arg(&self.conf);
        self.process = Some(Process::spawn(&format!("tinyproxy {}", self.bind), cmd).unwrap());
        wait_listening(SocketAddr::from(([127, 0, 0, 1], self.port)));
    }
}

/// A dante SOCKS5 server leaving from `external`, without authentication or with dante's
/// username method (RFC 1929), which checks a system account: [`DANTE_USER`], created by
/// `scripts/test`.
pub struct Dante {
    pub port: u16,
    login: bool,
    _process: Process,
}

/// The system account dante's username method checks in the tests, and its password.
pub const DANTE_USER: &str = "proxypool-socks";
pub const DANTE_PASSWORD: &str = "s0cks-test-pass";

impl Dante {
    pub fn start(dir: &Path, external: &str) -> Self {
        Self::start_inner(dir, external, false)
    }

    pub fn start_with_login(dir: &Path, external: &str) -> Self {
        let exists = Command::new("id")
            .arg(DANTE_USER)
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            exists,
            "the system user {DANTE_USER} is missing: run scripts/test (it creates it)"
        );
        Self::start_inner(dir, external, true)
    }

    fn start_inner(dir: &Path, external: &str, login: bool) -> Self {
        require("danted", "dante-server");
        let port = testkit::free_port("127.0.0.1");
        let conf = dir.join(format!("danted-{port}.conf"));
        let method = if login { "username" } else { "none" };
        std::fs::write(
            &conf,
            format!(
                "logoutput: stderr\ninternal: 127.0.0.1 port = {port}\nexternal: {external}\nsocksmethod: {method}\nclientmethod: none\nuser.privileged: root\nuser.unprivileged: nobody\nclient pass {{ from: 127.0.0.0/8 to: 0.0.0.0/0 }}\nsocks pass {{ from: 127.0.0.0/8 to: 0.0.0.0/0 command: connect }}\n"
            ),
        )
        .unwrap();
        let mut cmd = Command::new("danted");
        cmd.arg("-f").arg(&conf);
        let process = Process::spawn("danted", cmd).unwrap();
        wait_listening(SocketAddr::from(([127, 0, 0, 1], port)));
        Self {
            port,
            login,
            _process: process,
        }
    }

    /// Its URL, with the test account's credentials when it asks for them.
    pub fn url(&self) -> String {
        if self.login {
            self.url_as(DANTE_PASSWORD)
        } else {
            format!("socks5://127.0.0.1:{}", self.port)
        }
    }

    /// Its URL with the test account and `password`.
    pub fn url_as(&self, password: &str) -> String {
        format!("socks5://{DANTE_USER}:{password}@127.0.0.1:{}", self.port)
    }
}

/// The target: answers on every given loopback address (one site per address) with the
/// caller's source address, or — when the query says so for that source — a 403, a 429 or a
/// captcha page. Query: `do=403|429|captcha`, `for=IP[,IP…]` (default: every source).
/// `/headers` answers with the request's header names, one per line; `/bytes/N` with N bytes.
pub struct Target {
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub const CAPTCHA_PAGE: &str =
    "<html><body><div class=\"g-recaptcha\" data-sitekey=\"x\"></div></body></html>";

fn answer(source: IpAddr, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.uri().path() == "/headers" {
        let names: Vec<String> = request
            .headers()
            .keys()
            .map(|k| k.as_str().to_owned())
            .collect();
        return Response::new(Full::from(names.join("\n")));
    }
    if let Some(n) = request.uri().path().strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap_or(0);
        return Response::new(Full::from(vec![b'a'; n]));
    }
    let query = request.uri().query().unwrap_or("");
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_owned())
    };
    let applies =
        param("for").is_none_or(|list| list.split(',').any(|ip| ip == source.to_string()));
    let builder = Response::builder();
    match (param("do").as_deref(), applies) {
        (Some("403"), true) => builder.status(403).body(Full::from("forbidden\n")),
        (Some("429"), true) => builder
            .status(429)
            .header("retry-after", "30")
            .body(Full::from("slow down\n")),
        (Some("captcha"), true) => builder.status(200).body(Full::from(CAPTCHA_PAGE)),
        _ => builder.body(Full::from(format!("{source}\n"))),
    }
    .unwrap()
}

impl Target {
    pub fn start(ips: &[&str]) -> Self {
        let port = testkit::free_port(ips[0]);
        let listeners: Vec<StdListener> = ips
            .iter()
            .map(|ip| {
                let l = StdListener::bind((*ip, port)).unwrap();
                l.set_nonblocking(true).unwrap();
                l
            })
            .collect();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                for l in listeners {
                    let listener = tokio::net::TcpListener::from_std(l).unwrap();
                    tokio::spawn(async move {
                        loop {
                            let Ok((stream, peer)) = listener.accept().await else {
                                continue;
                            };
                            tokio::spawn(async move {
                                let service =
                                    service_fn(move |req: Request<Incoming>| async move {
                                        // `/body`: the size of the body, read in full first.
                                        if req.uri().path() == "/body" {
                                            let n =
                                                http_body_util::BodyExt::collect(req.into_body())
                                                    .await
                                                    .map_or(0, |b| b.to_bytes().len());
                                            return Ok(Response::new(Full::from(format!("{n}\n"))));
                                        }
                                        Ok::<_, std::convert::Infallible>(answer(peer.ip(), &req))
                                    });
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            });
                        }
                    });
                }
                let _ = stopped.await;
            });
            rt.shutdown_background();
        });
        Self {
            port,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self, ip: &str, path_and_query: &str) -> String {
        format!("http://{ip}:{}{path_and_query}", self.port)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A running `proxypool serve`.
pub struct Server {
    pub gateway: SocketAddr,
    pub api: String,
    pub upstreams: PathBuf,
    pub process: Process,
}

/// Tunables that make the pool move within a test's patience.
pub const FAST_POOL: &str = "[pool.health]\nmin_dwell_ms = 300\nrise_successes = 3\nprobing_weight = 0.5\nramp_duration_ms = 1000\n[pool.backoff]\nbase_ms = 5000\njitter = 0.1\n";

impl Server {
    pub fn start(dir: &Path, upstreams: &[String], config: &str, extra: &[&str]) -> Self {
        Self::start_logging(
            dir,
            upstreams,
            config,
            extra,
            "warn,proxypool::decision=info",
        )
    }

    /// As [`Server::start`], with `PROXYPOOL_LOG` set to `log`.
    pub fn start_logging(
        dir: &Path,
        upstreams: &[String],
        config: &str,
        extra: &[&str],
        log: &str,
    ) -> Self {
        let path = dir.join("upstreams.txt");
        std::fs::write(&path, upstreams.join("\n") + "\n").unwrap();
        let conf = dir.join("proxypool.toml");
        std::fs::write(&conf, config).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_proxypool"));
        cmd.args(["serve", "--upstreams"])
            .arg(&path)
            .arg("--config")
            .arg(&conf)
            .args([
                "--proxy-listen",
                "127.0.0.1:0",
                "--api-listen",
                "127.0.0.1:0",
            ])
            .args(extra)
            .env("PROXYPOOL_LOG", log);
        let mut process = Process::spawn("proxypool", cmd).unwrap();
        let line = process
            .wait_for_line("gateway listening on ", Duration::from_secs(20))
            .unwrap();
        let gateway = line["gateway listening on ".len()..].parse().unwrap();
        let line = process
            .wait_for_line("api listening on ", Duration::from_secs(20))
            .unwrap();
        let api = line["api listening on ".len()..].to_owned();
        Self {
            gateway,
            api,
            upstreams: path,
            process,
        }
    }

    /// A client of the gateway, as `user` (a session name or not).
    pub fn client(&self, user: Option<&str>) -> reqwest::Client {
        let mut proxy = reqwest::Proxy::http(format!("http://{}", self.gateway)).unwrap();
        if let Some(user) = user {
            proxy = proxy.basic_auth(user, "secret");
        }
        reqwest::Client::builder()
            .proxy(proxy)
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap()
    }

    pub async fn api_get(&self, path: &str) -> serde_json::Value {
        reqwest::get(format!("{}{path}", self.api))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The state of the address whose URL is `url`.
    pub async fn state_of(&self, url: &str) -> String {
        let rows = self.api_get("/v1/addresses").await;
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["address"] == url)
            .map(|r| r["state"].as_str().unwrap().to_owned())
            .unwrap_or_else(|| panic!("{url} not in {rows}"))
    }
}

/// One plain HTTP request through the gateway: status, `X-Proxypool-Error`, body.
pub async fn get(client: &reqwest::Client, url: &str) -> (u16, Option<String>, String) {
    let r = client.get(url).send().await.unwrap();
    let status = r.status().as_u16();
    let error = r
        .headers()
        .get("x-proxypool-error")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, error, r.text().await.unwrap())
}

/// A GET through a CONNECT tunnel of the gateway, on a raw socket: the status line of the
/// CONNECT answer and, if the tunnel opened, the body of the target's answer.
pub async fn get_via_connect(
    gateway: SocketAddr,
    user: Option<&str>,
    host: &str,
    port: u16,
    path: &str,
) -> (String, String) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let stream = tokio::net::TcpStream::connect(gateway).await.unwrap();
    let mut stream = BufReader::new(stream);
    let auth = user
        .map(|u| {
            use base64::Engine;
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{u}:secret"));
            format!("Proxy-Authorization: Basic {token}\r\n")
        })
        .unwrap_or_default();
    stream
        .get_mut()
        .write_all(
            format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut status = String::new();
    stream.read_line(&mut status).await.unwrap();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).await.unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        headers.push(line);
    }
    if !status.contains(" 200") {
        let mut body = String::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut body)).await;
        return (status.trim().to_owned(), headers.concat() + &body);
    }
    stream
        .get_mut()
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status.trim().to_owned(), body)
}

/// A minimal SOCKS5 server with username/password authentication (RFC 1928, RFC 1929),
/// CONNECT only, leaving from `bind`. Dante checks passwords against system accounts, which a
/// test should not create; this one checks the pair it is given.
pub struct Socks5Auth {
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

async fn socks5_session(
    mut client: tokio::net::TcpStream,
    bind: std::net::Ipv4Addr,
    user: &str,
    password: &str,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = [0u8; 2];
    client.read_exact(&mut head).await?;
    let mut methods = vec![0u8; usize::from(head[1])];
    client.read_exact(&mut methods).await?;
    if head[0] != 5 || !methods.contains(&2) {
        return client.write_all(&[5, 0xff]).await;
    }
    client.write_all(&[5, 2]).await?;
    let field = async |c: &mut tokio::net::TcpStream| -> std::io::Result<Vec<u8>> {
        let len = c.read_u8().await?;
        let mut v = vec![0u8; usize::from(len)];
        c.read_exact(&mut v).await?;
        Ok(v)
    };
    let _version = client.read_u8().await?;
    let (u, p) = (field(&mut client).await?, field(&mut client).await?);
    if u != user.as_bytes() || p != password.as_bytes() {
        return client.write_all(&[1, 1]).await;
    }
    client.write_all(&[1, 0]).await?;
    let mut request = [0u8; 4];
    client.read_exact(&mut request).await?;
    let host: IpAddr = match request[3] {
        1 => {
            let mut ip = [0u8; 4];
            client.read_exact(&mut ip).await?;
            IpAddr::from(ip)
        }
        3 => {
            let name = String::from_utf8(field(&mut client).await?).unwrap();
            let port_probe = tokio::net::lookup_host((name.as_str(), 0)).await?;
            port_probe
                .map(|a| a.ip())
                .find(IpAddr::is_ipv4)
                .ok_or_else(|| std::io::Error::other("no IPv4 address"))?
        }
        _ => return client.write_all(&[5, 8, 0, 1, 0, 0, 0, 0, 0, 0]).await,
    };
    let port = client.read_u16().await?;
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((bind, 0)))?;
    let Ok(mut upstream) = socket.connect(SocketAddr::new(host, port)).await else {
        return client.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0]).await;
    };
    client.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

impl Socks5Auth {
    pub fn start(bind: &str, user: &str, password: &str) -> Self {
        let listener = StdListener::bind(("127.0.0.1", 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let bind: std::net::Ipv4Addr = bind.parse().unwrap();
        let (user, password) = (user.to_owned(), password.to_owned());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let serve = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        let (user, password) = (user.clone(), password.clone());
                        tokio::spawn(async move {
                            let _ = socks5_session(stream, bind, &user, &password).await;
                        });
                    }
                };
                tokio::select! {
                    () = serve => {}
                    _ = stopped => {}
                }
            });
            rt.shutdown_background();
        });
        Self {
            port,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self, user: &str, password: &str, scheme: &str) -> String {
        format!("{scheme}://{user}:{password}@127.0.0.1:{}", self.port)
    }
}

impl Drop for Socks5Auth {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
