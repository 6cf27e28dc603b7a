//! `raftbox share` (shared folders and their members) and `raftbox groups` (groups of users,
//! admin token).

use anyhow::bail;
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::{Api, Connection};

#[derive(clap::Args, Debug)]
pub struct ShareArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ShareCommand,
}

/// Roles, each including the ones before it.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Role {
    /// Reads and syncs the folder's files.
    Viewer,
    /// Also commits, restores, moves and deletes files.
    Editor,
    /// Also manages members and deletes the folder.
    Owner,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Owner => "owner",
        }
    }
}

#[derive(clap::Subcommand, Debug)]
enum ShareCommand {
    /// List the namespaces you can access (your own and shared folders) with your role. Use
    /// a shared folder's id with `raftbox files --namespace ID …`.
    Ls,
    /// Create a shared folder named NAME; you become its owner.
    Create { name: String },
    /// List the members of shared folder ID (users and groups, with their roles).
    Members {
        #[arg(value_parser = crate::client::id)]
        id: String,
    },
    /// Invite a user or a group to shared folder ID with a role, or change the role of an
    /// existing member (owners only). An invitation grants nothing until accepted: the user
    /// runs `raftbox share accept ID` (a group's: an admin, with --group or --group-id).
    /// Name exactly one of --user, --user-id, --group, --group-id.
    Grant {
        #[arg(value_parser = crate::client::id)]
        id: String,
        /// The role to give.
        #[arg(long, value_enum)]
        role: Role,
        /// A user, by name.
        #[arg(long)]
        user: Option<String>,
        /// A user, by id.
        #[arg(long, value_parser = crate::client::id)]
        user_id: Option<String>,
        /// A group, by name.
        #[arg(long)]
        group: Option<String>,
        /// A group, by id.
        #[arg(long, value_parser = crate::client::id)]
        group_id: Option<String>,
    },
    /// Take a user's (--user-id) or a group's (--group-id) access to shared folder ID away
    /// (owners only). The last owner cannot be removed.
    Revoke {
        #[arg(value_parser = crate::client::id)]
        id: String,
        #[arg(long, conflicts_with = "group_id", required_unless_present = "group_id", value_parser = crate::client::id)]
        user_id: Option<String>,
        #[arg(long, value_parser = crate::client::id)]
        group_id: Option<String>,
    },
    /// List the shared folders you are invited to (accept or decline each by its id).
    Invitations,
    /// Accept the invitation to shared folder ID: it then syncs like your other folders.
    /// An admin accepts a group's invitation with --group or --group-id.
    Accept {
        #[arg(value_parser = crate::client::id)]
        id: String,
        /// A group's invitation, by group name (admin token).
        #[arg(long, conflicts_with = "group_id")]
        group: Option<String>,
        /// A group's invitation, by group id (admin token).
        #[arg(long, value_parser = crate::client::id)]
        group_id: Option<String>,
    },
    /// Decline the invitation to shared folder ID (removes it).
    Decline {
        #[arg(value_parser = crate::client::id)]
        id: String,
        /// A group's invitation, by group name (admin token).
        #[arg(long, conflicts_with = "group_id")]
        group: Option<String>,
        /// A group's invitation, by group id (admin token).
        #[arg(long, value_parser = crate::client::id)]
        group_id: Option<String>,
    },
    /// Leave shared folder ID (removes your own entry; access through a group stays). The
    /// last owner cannot leave.
    Leave {
        #[arg(value_parser = crate::client::id)]
        id: String,
    },
    /// Delete shared folder ID with all its files and history, for every member (owners only).
    Delete {
        #[arg(value_parser = crate::client::id)]
        id: String,
    },
}

#[derive(clap::Args, Debug)]
pub struct GroupsArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: GroupsCommand,
}

#[derive(clap::Subcommand, Debug)]
enum GroupsCommand {
    /// List the groups (admin token).
    Ls,
    /// Create a group named NAME (admin token); grant it access with `raftbox share grant`.
    Create { name: String },
    /// Show group ID and its members (admin token).
    Show {
        #[arg(value_parser = crate::client::id)]
        id: String,
    },
    /// Add user USER_ID to group ID (admin token).
    Add {
        #[arg(value_parser = crate::client::id)]
        id: String,
        #[arg(value_parser = crate::client::id)]
        user_id: String,
    },
    /// Remove user USER_ID from group ID (admin token).
    Remove {
        #[arg(value_parser = crate::client::id)]
        id: String,
        #[arg(value_parser = crate::client::id)]
        user_id: String,
    },
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or("?")
}

pub async fn run_share(args: ShareArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.connection, None)?;
    let (verb, done) = if matches!(args.command, ShareCommand::Accept { .. }) {
        ("accept", "accepted")
    } else {
        ("decline", "declined")
    };
    match args.command {
        ShareCommand::Ls => {
            let answer = api.call(Method::GET, "/v1/namespaces", None).await?;
            println!("{:<36}  {:<13} {:<7} name", "id", "kind", "role");
            for ns in answer["namespaces"].as_array().into_iter().flatten() {
                let name = if ns["kind"] == "user" { "(personal)" } else { text(ns, "name") };
                println!("{:<36}  {:<13} {:<7} {name}", text(ns, "namespaceId"), text(ns, "kind"), text(ns, "role"));
            }
        }
        ShareCommand::Create { name } => {
            let answer = api.call(Method::POST, "/v1/namespaces", Some(json!({ "name": name }))).await?;
            println!("{}", text(&answer, "namespaceId"));
        }
        ShareCommand::Members { id } => {
            let answer = api.call(Method::GET, &format!("/v1/namespaces/{id}/acl"), None).await?;
            println!("{:<7} {:<6} {:<36}  name", "role", "kind", "id");
            for entry in answer["entries"].as_array().into_iter().flatten() {
                let (kind, id, name) = match entry["userId"].as_str() {
                    Some(user_id) => ("user", user_id, text(entry, "userName")),
                    None => ("group", text(entry, "groupId"), text(entry, "groupName")),
                };
                let pending = if entry["pending"] == true { "  (invited, not yet accepted)" } else { "" };
                println!("{:<7} {kind:<6} {id:<36}  {name}{pending}", text(entry, "role"));
            }
        }
        ShareCommand::Grant { id, role, user, user_id, group, group_id } => {
            let mut body = json!({ "role": role.as_str() });
            for (key, value) in [("userName", user), ("userId", user_id), ("groupName", group), ("groupId", group_id)] {
                if let Some(value) = value {
                    body[key] = json!(value);
                }
            }
            api.call(Method::PUT, &format!("/v1/namespaces/{id}/acl"), Some(body)).await?;
            eprintln!("{}: a new member is invited and accepts with `raftbox share accept {id}`", role.as_str());
        }
        ShareCommand::Revoke { id, user_id, group_id } => {
            let path = match (user_id, group_id) {
                (Some(user_id), _) => format!("/v1/namespaces/{id}/acl/users/{user_id}"),
                (None, Some(group_id)) => format!("/v1/namespaces/{id}/acl/groups/{group_id}"),
                (None, None) => bail!("name --user-id or --group-id"),
            };
            api.call(Method::DELETE, &path, None).await?;
            eprintln!("revoked");
        }
        ShareCommand::Invitations => {
            let mut page_token: Option<String> = None;
            println!("{:<36}  {:<7} name", "id", "role");
            loop {
                let path = match &page_token {
                    Some(token) => format!("/v1/me/invitations?pageToken={token}"),
                    None => "/v1/me/invitations".to_string(),
                };
                let answer = api.call(Method::GET, &path, None).await?;
                for invitation in answer["invitations"].as_array().into_iter().flatten() {
                    let (id, role) = (text(invitation, "namespaceId"), text(invitation, "role"));
                    println!("{id:<36}  {role:<7} {}", text(invitation, "name"));
                }
                match answer["nextPageToken"].as_str() {
                    Some(next) => page_token = Some(next.to_string()),
                    None => break,
                }
            }
        }
        ShareCommand::Accept { id, group, group_id } | ShareCommand::Decline { id, group, group_id } => {
            let body = match (group, group_id) {
                (Some(name), _) => Some(json!({ "groupName": name })),
                (None, Some(group_id)) => Some(json!({ "groupId": group_id })),
                (None, None) => None,
            };
            api.call(Method::POST, &format!("/v1/namespaces/{id}/{verb}"), body).await?;
            eprintln!("{done} {id}");
        }
        ShareCommand::Leave { id } => {
            api.call(Method::POST, &format!("/v1/namespaces/{id}/leave"), None).await?;
            eprintln!("left {id}");
        }
        ShareCommand::Delete { id } => {
            api.call(Method::DELETE, &format!("/v1/namespaces/{id}"), None).await?;
            eprintln!("deleted {id}");
        }
    }
    Ok(())
}

pub async fn run_groups(args: GroupsArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.connection, None)?;
    match args.command {
        GroupsCommand::Ls => {
            let answer = api.call(Method::GET, "/v1/admin/groups", None).await?;
            println!("{:<36}  name", "id");
            for group in answer["groups"].as_array().into_iter().flatten() {
                println!("{:<36}  {}", text(group, "groupId"), text(group, "name"));
            }
        }
        GroupsCommand::Create { name } => {
            let answer = api.call(Method::POST, "/v1/admin/groups", Some(json!({ "name": name }))).await?;
            println!("{}", text(&answer, "groupId"));
        }
        GroupsCommand::Show { id } => {
            let answer = api.call(Method::GET, &format!("/v1/admin/groups/{id}"), None).await?;
            println!("{} ({})", text(&answer, "name"), text(&answer, "groupId"));
            for member in answer["members"].as_array().into_iter().flatten() {
                println!("  {:<36}  {}", text(member, "userId"), text(member, "name"));
            }
        }
        GroupsCommand::Add { id, user_id } => {
            api.call(Method::PUT, &format!("/v1/admin/groups/{id}/members/{user_id}"), None).await?;
            eprintln!("{user_id} added to {id}");
        }
        GroupsCommand::Remove { id, user_id } => {
            api.call(Method::DELETE, &format!("/v1/admin/groups/{id}/members/{user_id}"), None).await?;
            eprintln!("{user_id} removed from {id}");
        }
    }
    Ok(())
}
