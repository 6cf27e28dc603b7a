//! What the notification channels hear: one summary of each entry this node applies.
//!
//! The hub listens to the node's applied entries and tells every open channel (long polls
//! and WebSockets) what each one may have changed ([`Touched`]: change feeds, access,
//! group memberships, revoked tokens). A channel looks only at the items that concern it,
//! so what an entry costs a channel does not grow with the namespaces its caller can read.
//! When the summaries cannot be trusted to be complete (a snapshot replaced the state, or
//! a listener fell more than [`EVENTS_QUEUED_MAX`] entries behind) channels hear
//! [`Event::Everything`] and read the caller's namespaces again.

use std::sync::Arc;

use raftbox_raft::{Applied, RaftNode};
use raftbox_storage::command::Touched;
use tokio::sync::broadcast::{self, error::RecvError};

/// Events waiting for one slow channel, at most; beyond, it hears [`Event::Everything`].
pub const EVENTS_QUEUED_MAX: usize = 1_024;

/// What a channel hears.
#[derive(Debug, Clone)]
pub enum Event {
    /// One applied entry may have changed these.
    Touched(Arc<Touched>),
    /// Anything may have changed: read again.
    Everything,
}

/// The node's summaries of applied entries, for every channel.
#[derive(Clone)]
pub struct Hub {
    events: broadcast::Sender<Event>,
}

impl Hub {
    /// Starts summarizing what `node` applies (one task for the node's life; it ends when
    /// the node's state machine goes away).
    pub fn start(node: &RaftNode) -> Hub {
        let events = broadcast::channel(EVENTS_QUEUED_MAX).0;
        let hub = Hub { events };
        let mut applied = node.applied_events();
        let sender = hub.events.clone();
        tokio::spawn(async move {
            loop {
                let event = match applied.recv().await {
                    // No channel open: nothing to summarize, nobody to tell (a channel opened
                    // later reads the state after it subscribed).
                    Ok(Applied::Commands(_)) if sender.receiver_count() == 0 => continue,
                    Ok(Applied::Commands(commands)) => {
                        let mut touched = Touched::default();
                        for command in commands.iter() {
                            touched.add(command);
                        }
                        if touched.is_empty() {
                            continue;
                        }
                        Event::Touched(Arc::new(touched))
                    }
                    Ok(Applied::Reset) | Err(RecvError::Lagged(_)) => Event::Everything,
                    Err(RecvError::Closed) => return,
                };
                // No channel open: nobody to tell.
                let _ = sender.send(event);
            }
        });
        hub
    }

    /// Hears every event from now on. Subscribe before reading the state the events are
    /// about, so nothing applied after that read goes unheard.
    pub fn listen(&self) -> Listener {
        Listener { events: self.events.subscribe() }
    }
}

/// One channel's subscription.
pub struct Listener {
    events: broadcast::Receiver<Event>,
}

impl Listener {
    /// The next event; `None` once the node shuts down. A listener that fell behind hears
    /// [`Event::Everything`] for what it missed.
    pub async fn next(&mut self) -> Option<Event> {
        match self.events.recv().await {
            Ok(event) => Some(event),
            Err(RecvError::Lagged(_)) => Some(Event::Everything),
            Err(RecvError::Closed) => None,
        }
    }
}
