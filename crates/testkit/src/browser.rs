//! Headless Chromium through a chromedriver of our own, spoken to over the WebDriver
//! protocol: enough to load pages, type, click, run a script and take screenshots.

use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::Process;

/// How long a page may take to show what a test waits for: a guard, not a bound.
const WAIT: Duration = Duration::from_secs(30);

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

/// A WebDriver session on a chromedriver of our own; ends (closing Chromium) when dropped.
#[derive(Debug)]
pub struct Browser {
    base: String,
    http: reqwest::Client,
    _driver: Process,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium window of `width` × `height`.
    pub async fn start(width: u32, height: u32) -> Self {
        require("chromedriver", "chromium-driver");
        require("chromium", "chromium");
        let port = crate::free_port("127.0.0.1");
        let mut cmd = Command::new("chromedriver");
        cmd.arg(format!("--port={port}"));
        let mut driver = Process::spawn("chromedriver", cmd).expect("cannot start chromedriver");
        driver
            .wait_for_line("ChromeDriver was started", WAIT)
            .expect("chromedriver did not start");
        let http = reqwest::Client::new();
        let created: Value = http
            .post(format!("http://127.0.0.1:{port}/session"))
            .json(&json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": "/usr/bin/chromium",
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", format!("--window-size={width},{height}")]
                }
            }}}))
            .send()
            .await
            .expect("chromedriver does not answer")
            .json()
            .await
            .expect("chromedriver answered no JSON");
        let id = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {created}"));
        Self {
            base: format!("http://127.0.0.1:{port}/session/{id}"),
            http,
            _driver: driver,
        }
    }

    /// One WebDriver command; its `value`.
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let v: Value = request
            .send()
            .await
            .expect("chromedriver does not answer")
            .json()
            .await
            .expect("chromedriver answered no JSON");
        v["value"].clone()
    }

    /// Loads `url` (and waits for it, as WebDriver does).
    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub async fn script(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Waits until `script` returns something other than null/false; returns it.
    pub async fn wait_for(&self, script: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let v = self.script(script).await;
            if !(v.is_null() || v == Value::Bool(false)) && v.get("error").is_none() {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "never true: {script} (last: {v})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The WebDriver id of the element `css` selects.
    async fn element(&self, css: &str) -> String {
        let found = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_owned()
    }

    /// Types `text` into the element `css` selects (after clearing it).
    pub async fn fill(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/clear"),
            Some(json!({})),
        )
        .await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Clicks the element `css` selects, as a person would.
    pub async fn click(&self, css: &str) {
        let id = self.element(css).await;
        let v = self
            .call(
                reqwest::Method::POST,
                &format!("/element/{id}/click"),
                Some(json!({})),
            )
            .await;
        assert!(v.is_null(), "clicking {css}: {v}");
    }

    /// The page's address.
    pub async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Writes a PNG of the whole page to `path` (creating its directory): the window grows
    /// to the page's height for the shot, then gets its size back.
    pub async fn screenshot(&self, path: &Path) {
        use base64::Engine;
        let window = self.call(reqwest::Method::GET, "/window/rect", None).await;
        let page_height = self
            .script("return document.documentElement.scrollHeight")
            .await
            .as_u64()
            .unwrap_or(0);
        let inner_height = self
            .script("return window.innerHeight")
            .await
            .as_u64()
            .unwrap_or(0);
        let chrome = window["height"]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(inner_height);
        if page_height > inner_height {
            self.call(
                reqwest::Method::POST,
                "/window/rect",
                Some(json!({"width": window["width"], "height": page_height + chrome})),
            )
            .await;
        }
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        if page_height > inner_height {
            self.call(
                reqwest::Method::POST,
                "/window/rect",
                Some(json!({"width": window["width"], "height": window["height"]})),
            )
            .await;
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("no screenshot"))
            .expect("the screenshot is not base64");
        assert!(bytes.starts_with(b"\x89PNG"));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("cannot create the screenshot directory");
        }
        std::fs::write(path, &bytes).expect("cannot write the screenshot");
        eprintln!("screenshot: {}", path.display());
    }
}

impl Drop for Browser {
    /// Ends the WebDriver session, which closes Chromium (killing chromedriver alone could
    /// leave the browser behind). Plain blocking HTTP: `Drop` cannot await.
    fn drop(&mut self) {
        use std::io::{Read, Write};
        let Some(rest) = self.base.strip_prefix("http://") else {
            return;
        };
        let Some((host, path)) = rest.split_once('/') else {
            return;
        };
        if let Ok(mut stream) = std::net::TcpStream::connect(host) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = write!(
                stream,
                "DELETE /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            );
            let _ = stream.read_to_end(&mut Vec::new());
        }
    }
}
