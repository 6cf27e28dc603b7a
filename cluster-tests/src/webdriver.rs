//! A headless Chromium driven through `chromedriver` (W3C WebDriver over HTTP), for the web
//! console's browser test.
//!
//! The few WebDriver commands the test needs are sent with the harness's own `reqwest`
//! (navigate, find, click, type, read text, run a script, screenshot), so no WebDriver
//! client crate comes in. [`Browser::start`] launches `chromedriver` on a free port and
//! opens a session on Debian's `chromium` (`--headless=new --no-sandbox`, so it also runs
//! as root in CI) with its profile and downloads in a temporary directory;
//! [`Browser::close`] ends the session, and dropping the browser kills `chromedriver` and
//! whatever it started (its process group).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context as _, Result};
use serde_json::{json, Value};

use crate::{free_ports, Deadline};

/// The key under which WebDriver names an element.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long `chromedriver` may take to listen.
const DRIVER_START: Duration = Duration::from_secs(20);
/// Bound on every WebDriver command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).flat_map(|dir| names.iter().map(move |name| dir.join(name))).find(|p| p.is_file())
}

pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`.
    session: String,
    /// The profile and downloads directory, removed on drop.
    profile: tempfile::TempDir,
}

/// An element found on the page (its WebDriver reference).
#[derive(Debug, Clone)]
pub struct Element(String);

impl Browser {
    /// Starts `chromedriver` and a headless Chromium session with a window of `width`×`height`.
    pub async fn start(width: u32, height: u32) -> Result<Browser> {
        let driver_bin = on_path(&["chromedriver"])
            .context("chromedriver is not installed (Debian: apt-get install chromium chromium-driver)")?;
        let chromium = on_path(&["chromium", "chromium-browser", "google-chrome"])
            .context("chromium is not installed (Debian: apt-get install chromium chromium-driver)")?;
        let port = free_ports(1)?[0];
        let profile = tempfile::tempdir().context("browser profile directory")?;
        let mut command = Command::new(&driver_bin);
        command.arg(format!("--port={port}")).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        // Its own process group, so dropping the browser can end Chromium's processes too.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let driver = command.spawn().with_context(|| format!("start {}", driver_bin.display()))?;
        let http = reqwest::Client::builder().timeout(COMMAND_TIMEOUT).build()?;
        let mut browser = Browser { driver, http, session: format!("http://127.0.0.1:{port}"), profile };
        browser.wait_driver().await?;
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", browser.profile.path().display()),
                ],
            },
        }}});
        let answer = browser.call("POST", "/session", Some(capabilities)).await.context("open a browser session")?;
        let id = answer["sessionId"].as_str().context("session id")?.to_owned();
        browser.session = format!("{}/session/{id}", browser.session);
        // Downloads go to the profile's directory (dropped with it), not ~/Downloads.
        let downloads = browser.download_dir();
        std::fs::create_dir_all(&downloads)?;
        let behavior = json!({ "cmd": "Browser.setDownloadBehavior",
            "params": { "behavior": "allow", "downloadPath": downloads } });
        browser.call("POST", "/goog/cdp/execute", Some(behavior)).await.context("set the download directory")?;
        Ok(browser)
    }

    /// Where the browser saves downloads (inside its temporary profile).
    pub fn download_dir(&self) -> PathBuf {
        self.profile.path().join("downloads")
    }

    async fn wait_driver(&mut self) -> Result<()> {
        let deadline = Deadline::after(DRIVER_START, "chromedriver listening");
        loop {
            if let Some(status) = self.driver.try_wait()? {
                bail!("chromedriver exited at start: {status}");
            }
            let last = match self.http.get(format!("{}/status", self.session)).send().await {
                Ok(response) if response.status().is_success() => return Ok(()),
                Ok(response) => response.status().to_string(),
                Err(e) => e.to_string(),
            };
            deadline.tick(&last).await?;
        }
    }

    /// One WebDriver command (`path` below the session, or `/session` itself); its `value`.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}{path}", self.session);
        let request = match method {
            "GET" => self.http.get(&url),
            "DELETE" => self.http.delete(&url),
            _ => self.http.post(&url).json(&body.unwrap_or_else(|| json!({}))),
        };
        let response = request.send().await.with_context(|| format!("WebDriver {method} {path}"))?;
        let status = response.status();
        let answer: Value = response.json().await.with_context(|| format!("WebDriver {method} {path}: answer"))?;
        ensure!(status.is_success(), "WebDriver {method} {path}: {status} {}", answer["value"]);
        Ok(answer["value"].clone())
    }

    pub async fn goto(&self, url: &str) -> Result<()> {
        self.call("POST", "/url", Some(json!({ "url": url }))).await.map(drop)
    }

    /// The elements matching a CSS selector now (maybe none).
    pub async fn find_all(&self, css: &str) -> Result<Vec<Element>> {
        let found = self.call("POST", "/elements", Some(json!({ "using": "css selector", "value": css }))).await?;
        let list = found.as_array().context("elements")?;
        list.iter().map(|e| Ok(Element(e[ELEMENT_KEY].as_str().context("element reference")?.to_owned()))).collect()
    }

    /// The first element matching `css` whose text contains `text`, awaited until `limit`.
    pub async fn wait_for(&self, css: &str, text: &str, limit: Duration) -> Result<Element> {
        let deadline = Deadline::after(limit, format!("an element {css:?} containing {text:?}"));
        loop {
            let mut seen = Vec::new();
            for element in self.find_all(css).await? {
                // The page may replace the element between finding and reading it.
                let Ok(shown) = self.text(&element).await else { continue };
                if shown.contains(text) {
                    return Ok(element);
                }
                seen.push(shown);
            }
            let error = self
                .script("const e = document.getElementById('error'); return e && !e.hidden ? e.textContent : '';")
                .await?;
            deadline.tick(&format!("texts {seen:?}; error box {error}")).await?;
        }
    }

    /// The text of the first element matching `css`, read in one script (so a page that
    /// redraws itself cannot swap the element between finding and reading); `None` if none.
    pub async fn text_of(&self, css: &str) -> Result<Option<String>> {
        let script = "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;";
        let text = self.call("POST", "/execute/sync", Some(json!({ "script": script, "args": [css] }))).await?;
        Ok(text.as_str().map(str::to_owned))
    }

    pub async fn text(&self, element: &Element) -> Result<String> {
        let text = self.call("GET", &format!("/element/{}/text", element.0), None).await?;
        Ok(text.as_str().unwrap_or_default().to_owned())
    }

    pub async fn click(&self, element: &Element) -> Result<()> {
        self.call("POST", &format!("/element/{}/click", element.0), None).await.map(drop)
    }

    pub async fn type_into(&self, element: &Element, text: &str) -> Result<()> {
        self.call("POST", &format!("/element/{}/value", element.0), Some(json!({ "text": text }))).await.map(drop)
    }

    /// Runs `body` (a function body; `return` gives the result) in the page.
    pub async fn script(&self, body: &str) -> Result<Value> {
        self.call("POST", "/execute/sync", Some(json!({ "script": body, "args": [] }))).await
    }

    /// Saves a PNG of the window to `path`.
    pub async fn screenshot(&self, path: &Path) -> Result<()> {
        use base64::Engine as _;
        let png = self.call("GET", "/screenshot", None).await?;
        let png = base64::engine::general_purpose::STANDARD.decode(png.as_str().context("screenshot")?)?;
        std::fs::write(path, png).with_context(|| format!("write {}", path.display()))
    }

    /// Ends the session (Chromium exits); dropping then stops `chromedriver`.
    pub async fn close(self) -> Result<()> {
        self.call("DELETE", "", None).await.map(drop)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: chromedriver and any Chromium process it left.
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.driver.id())]).status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
