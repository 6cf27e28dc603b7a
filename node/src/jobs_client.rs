//! `raftbox jobs`: a command-line client of the job service.

use anyhow::bail;
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::{problem, Api, Connection};

#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: JobsCommand,
}

#[derive(clap::Subcommand, Debug)]
enum JobsCommand {
    /// Schedule a job: `--at 2026-12-01T09:00:00Z` once, or `--cron "0 9 * * 1" --timezone Europe/Paris`.
    Create {
        /// webhook, noop, fail or sleep.
        #[arg(long = "type", default_value = "webhook")]
        job_type: String,
        /// The URL a webhook job calls.
        #[arg(long)]
        target: Option<String>,
        /// JSON object handed to the job.
        #[arg(long, default_value = "{}")]
        payload: String,
        /// One-off: when to run (RFC 3339 UTC).
        #[arg(long, conflicts_with = "cron")]
        at: Option<String>,
        /// Recurring: a 5-field (or 6-field, seconds first) cron expression.
        #[arg(long, requires = "timezone")]
        cron: Option<String>,
        /// IANA timezone of the cron expression.
        #[arg(long)]
        timezone: Option<String>,
        #[arg(long, default_value_t = 3)]
        max_retries: u32,
        /// Idempotency-Key for a safe retry of this create.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Show a job.
    Get {
        #[arg(value_parser = crate::client::id)]
        job_id: String,
    },
    /// List your jobs.
    Ls,
    /// Show a job's runs, newest first.
    Runs {
        #[arg(value_parser = crate::client::id)]
        job_id: String,
    },
    /// Cancel a job (future runs stop).
    Cancel {
        #[arg(value_parser = crate::client::id)]
        job_id: String,
    },
    /// Pause a job: no fire or retry starts until it is resumed (a run in progress ends as it would).
    Pause {
        #[arg(value_parser = crate::client::id)]
        job_id: String,
    },
    /// Resume a paused job; fires a recurring job missed meanwhile are not made up.
    Resume {
        #[arg(value_parser = crate::client::id)]
        job_id: String,
    },
    /// Show the secret that signs your webhook calls (Standard Webhooks `whsec_…`), or make
    /// a new one with --rotate (the old one goes on signing beside it for a while).
    Secret {
        /// Make a new secret.
        #[arg(long)]
        rotate: bool,
        /// With --rotate: hours the old secret goes on signing too (0 to 168).
        #[arg(long, default_value_t = 24, requires = "rotate")]
        keep_previous_hours: u64,
    },
    /// Fire a job now, once (fenced and recorded like a scheduled fire); its schedule goes on.
    Run {
        #[arg(value_parser = crate::client::id)]
        job_id: String,
        /// Idempotency-Key, so a retry of this command fires once.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
}

async fn call(api: &Api, method: Method, path: &str, body: Option<Value>, key: Option<&str>) -> anyhow::Result<Value> {
    let mut request = api.request_keyed(method, path, key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let (status, answer) = api.send(request).await?;
    if !status.is_success() {
        bail!("{path}: {}", problem(status, &answer));
    }
    Ok(answer)
}

/// `POST /v1/jobs/{id}:{verb}`, then the job's state on one line.
async fn method(api: &Api, job_id: &str, verb: &str, key: Option<&str>) -> anyhow::Result<()> {
    let job = call(api, Method::POST, &format!("/v1/jobs/{job_id}:{verb}"), None, key).await?;
    let paused = if job["paused"] == true { " (paused)" } else { "" };
    println!(
        "{job_id} {}{paused}, next run {}",
        job["status"].as_str().unwrap_or("?"),
        job["nextRunAt"].as_str().unwrap_or("-")
    );
    Ok(())
}

fn print(value: &Value) {
    use std::io::Write as _;
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(value).unwrap_or_default());
}

pub async fn run(args: JobsArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.connection, None)?;
    match args.command {
        JobsCommand::Create { job_type, target, payload, at, cron, timezone, max_retries, idempotency_key } => {
            let payload: Value = serde_json::from_str(&payload).map_err(|e| anyhow::anyhow!("--payload: {e}"))?;
            let schedule = match (at, cron) {
                (Some(at), None) => json!({ "runAt": at }),
                (None, Some(cron)) => json!({ "cron": cron, "timezone": timezone }),
                _ => bail!("give --at, or --cron with --timezone"),
            };
            let body = json!({ "type": job_type, "target": target, "payload": payload, "schedule": schedule, "maxRetries": max_retries });
            let created = call(&api, Method::POST, "/v1/jobs", Some(body), idempotency_key.as_deref()).await?;
            // The id alone on stdout, so `JOB_ID=$(raftbox jobs create …)` captures it.
            let job_id = created["jobId"].as_str().unwrap_or("?");
            println!("{job_id}");
            eprintln!(
                "created job {job_id}: {}, next run {}",
                created["status"].as_str().unwrap_or("?"),
                created["nextRunAt"].as_str().unwrap_or("-")
            );
        }
        JobsCommand::Get { job_id } => {
            print(&call(&api, Method::GET, &format!("/v1/jobs/{job_id}"), None, None).await?)
        }
        JobsCommand::Ls => {
            let mut token: Option<String> = None;
            loop {
                let path = match &token {
                    Some(t) => format!("/v1/jobs?pageToken={t}"),
                    None => "/v1/jobs".to_string(),
                };
                let page = call(&api, Method::GET, &path, None, None).await?;
                for job in page["jobs"].as_array().into_iter().flatten() {
                    let status = match job["paused"] == true {
                        true => "PAUSED",
                        false => job["status"].as_str().unwrap_or("?"),
                    };
                    println!(
                        "{}  {:<10} {:<8} next {}",
                        job["jobId"].as_str().unwrap_or("?"),
                        status,
                        job["type"].as_str().unwrap_or("?"),
                        job["nextRunAt"].as_str().unwrap_or("-")
                    );
                }
                match page["nextPageToken"].as_str() {
                    Some(next) => token = Some(next.to_string()),
                    None => break,
                }
            }
        }
        JobsCommand::Runs { job_id } => {
            let page = call(&api, Method::GET, &format!("/v1/jobs/{job_id}/runs"), None, None).await?;
            for run in page["runs"].as_array().into_iter().flatten() {
                println!(
                    "attempt {} {:<10} scheduled {} started {} on {} (fence {}){}",
                    run["attempt"],
                    run["status"].as_str().unwrap_or("?"),
                    run["scheduledFor"].as_str().unwrap_or("?"),
                    run["startedAt"].as_str().unwrap_or("?"),
                    run["workerId"].as_str().unwrap_or("?"),
                    run["fenceToken"],
                    run["error"].as_str().map(|e| format!(": {e}")).unwrap_or_default()
                );
            }
        }
        JobsCommand::Cancel { job_id } => {
            let job = call(&api, Method::DELETE, &format!("/v1/jobs/{job_id}"), None, None).await?;
            println!("{job_id} {}", job["status"].as_str().unwrap_or("?"));
        }
        JobsCommand::Secret { rotate, keep_previous_hours } => {
            let answer = match rotate {
                true => {
                    let body = json!({ "keepPreviousHours": keep_previous_hours });
                    call(&api, Method::POST, "/v1/me/webhook-secret", Some(body), None).await?
                }
                false => call(&api, Method::GET, "/v1/me/webhook-secret", None, None).await?,
            };
            // The secret alone on stdout, for `SECRET=$(raftbox jobs secret)`.
            println!("{}", answer["secret"].as_str().unwrap_or("?"));
            match answer["previousValidUntil"].as_str() {
                Some(until) => eprintln!(
                    "made {}; the previous secret also signs until {until}",
                    answer["createdAt"].as_str().unwrap_or("?")
                ),
                None => eprintln!("made {}", answer["createdAt"].as_str().unwrap_or("?")),
            }
        }
        JobsCommand::Pause { job_id } => method(&api, &job_id, "pause", None).await?,
        JobsCommand::Resume { job_id } => method(&api, &job_id, "resume", None).await?,
        JobsCommand::Run { job_id, idempotency_key } => {
            method(&api, &job_id, "run", idempotency_key.as_deref()).await?
        }
    }
    Ok(())
}
