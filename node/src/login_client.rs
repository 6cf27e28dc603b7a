//! `raftbox login` (a session token for your name and password, kept where every raftbox
//! command finds it) and `raftbox passwd` (your password, or a user's with the admin token).

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::{problem, saved_token_path, Api, Connection};

#[derive(clap::Args, Debug)]
pub struct LoginArgs {
    #[command(flatten)]
    connection: Connection,
    /// Your user name.
    name: String,
    /// Read the password from the first line of stdin instead of asking on the terminal.
    #[arg(long)]
    password_stdin: bool,
    /// Where to keep the session token (default: $XDG_CONFIG_HOME/raftbox/token, else
    /// ~/.config/raftbox/token, which every raftbox command reads when given no other token).
    #[arg(long)]
    save_to: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct PasswdArgs {
    #[command(flatten)]
    connection: Connection,
    /// Set this user's password instead of yours (admin token).
    #[arg(long, value_parser = crate::client::id)]
    user: Option<String>,
    /// Remove the user's password: they log in with tokens only (with --user; admin token).
    #[arg(long, requires = "user")]
    remove: bool,
    /// Read the new password from stdin's first line (and, to change your own once one is
    /// set, the current one from its second) instead of asking on the terminal.
    #[arg(long)]
    password_stdin: bool,
}

/// Lines read from stdin (`--password-stdin`), or asked for on the terminal without echo.
struct Secrets {
    lines: Option<Vec<String>>,
}

impl Secrets {
    fn new(from_stdin: bool) -> anyhow::Result<Secrets> {
        if !from_stdin {
            if !std::io::stdin().is_terminal() {
                bail!("no terminal to ask for a password on: give --password-stdin");
            }
            return Ok(Secrets { lines: None });
        }
        let lines = std::io::stdin().lock().lines().take(2).collect::<Result<Vec<_>, _>>().context("read stdin")?;
        Ok(Secrets { lines: Some(lines) })
    }

    /// Line `index` of stdin, or the answer to `prompt`.
    fn get(&self, index: usize, prompt: &str) -> anyhow::Result<Option<String>> {
        match &self.lines {
            Some(lines) => Ok(lines.get(index).cloned()),
            None => Ok(Some(rpassword::prompt_password(prompt).context("read the password")?)),
        }
    }
}

/// Writes `token` to `path`, readable by its owner only, replacing any earlier one whole.
fn save(path: &Path, token: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = path.parent().context("the token file's folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let staged = path.with_extension("new");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&staged)
        .with_context(|| format!("create {}", staged.display()))?;
    writeln!(file, "{token}").and_then(|()| file.sync_all()).with_context(|| format!("write {}", staged.display()))?;
    std::fs::rename(&staged, path).with_context(|| format!("rename to {}", path.display()))
}

pub async fn run_login(args: LoginArgs) -> anyhow::Result<()> {
    let secrets = Secrets::new(args.password_stdin)?;
    let password = secrets.get(0, &format!("password for {}: ", args.name))?.context("no password on stdin")?;
    let (http, url) = args.connection.anonymous()?;
    let response = http
        .post(format!("{url}/v1/login"))
        .json(&json!({ "name": args.name, "password": password }))
        .send()
        .await
        .with_context(|| format!("POST {url}/v1/login"))?;
    let status = response.status();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        bail!("login: {}", problem(status, &answer));
    }
    let token = answer["token"].as_str().context("the answer holds no token")?;
    let path = match args.save_to {
        Some(path) => path,
        None => saved_token_path().context("no home folder to keep the token in: give --save-to")?,
    };
    save(&path, token)?;
    let until = answer["expiresAt"].as_str().unwrap_or("?");
    eprintln!("logged in as {} until {until}; the token is in {}", args.name, path.display());
    Ok(())
}

pub async fn run_passwd(args: PasswdArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.connection, None)?;
    if let (Some(user), true) = (&args.user, args.remove) {
        api.call(Method::DELETE, &format!("/v1/admin/users/{user}/password"), None).await?;
        eprintln!("user {user} has no password now");
        return Ok(());
    }
    let secrets = Secrets::new(args.password_stdin)?;
    let password = secrets.get(0, "new password: ")?.context("no new password on stdin")?;
    if !args.password_stdin && secrets.get(0, "again: ")?.as_deref() != Some(password.as_str()) {
        bail!("the two passwords differ; nothing changed");
    }
    match &args.user {
        Some(user) => {
            let body = json!({ "password": password });
            api.call(Method::PUT, &format!("/v1/admin/users/{user}/password"), Some(body)).await?;
            eprintln!("password set for user {user}");
        }
        None => {
            let mut body = json!({ "password": password });
            let first = api.request(Method::PUT, "/v1/me/password").json(&body).send().await?;
            if first.status() == reqwest::StatusCode::FORBIDDEN {
                // A password is set: the current one is needed.
                let current = secrets.get(1, "current password: ")?.context("no current password on stdin")?;
                body["currentPassword"] = Value::String(current);
                api.call(Method::PUT, "/v1/me/password", Some(body)).await?;
            } else if !first.status().is_success() {
                let status = first.status();
                let answer: Value = first.json().await.unwrap_or(Value::Null);
                bail!("/v1/me/password: {}", problem(status, &answer));
            }
            eprintln!("your password is set");
        }
    }
    Ok(())
}
