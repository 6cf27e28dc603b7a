//! Read-index rounds shared by every reader waiting at once (as etcd batches linearizable
//! reads): a reader joins the next round, a task runs one round at a time, and each round's
//! index answers every reader that joined before it began. A round that began after a
//! reader joined proves what a round of its own would, so sharing changes no guarantee; and
//! however many readers arrive, the leader confirms its leadership at most once at a time
//! per node. A paced lane (`pace` > 0) also waits that long between the starts of two
//! rounds: what anyone can ask for without credentials (a lookup of a token this node does
//! not know, which a flood of forged tokens makes) costs the cluster at most one round per
//! pace, however fast it is asked.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Readers queued for the next round, at most (more wait to join).
const WAITING_READERS_MAX: usize = 65_536;

type Reader = oneshot::Sender<Option<u64>>;

/// The handle readers join rounds through.
#[derive(Clone)]
pub(crate) struct ReadRounds {
    tx: mpsc::Sender<Reader>,
}

/// The other end, for [`run`].
pub(crate) struct Waiting(mpsc::Receiver<Reader>);

impl ReadRounds {
    pub(crate) fn new() -> (ReadRounds, Waiting) {
        let (tx, rx) = mpsc::channel(WAITING_READERS_MAX);
        (ReadRounds { tx }, Waiting(rx))
    }

    /// The index of the next round to begin, or `None` if it found none (no leader
    /// confirmed one) or `deadline` passed first.
    pub(crate) async fn next_index(&self, deadline: Instant) -> Option<u64> {
        let (reader, answer) = oneshot::channel();
        tokio::time::timeout_at(deadline, self.tx.send(reader)).await.ok()?.ok()?;
        tokio::time::timeout_at(deadline, answer).await.ok()?.ok()?
    }
}

/// Runs rounds until every [`ReadRounds`] handle is gone: takes the readers waiting, runs
/// one `round` (which bounds its own time), answers them all, again — no sooner than `pace`
/// after the previous round began.
pub(crate) async fn run<F, Fut>(Waiting(mut rx): Waiting, round: F, pace: Duration)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<u64>>,
{
    let mut previous: Option<Instant> = None;
    while let Some(first) = rx.recv().await {
        if let Some(began) = previous {
            // The lane's pace; readers arriving meanwhile join this round.
            tokio::time::sleep_until(began + pace).await;
        }
        previous = Some(Instant::now());
        // Everyone who joined before the round begins; later ones wait for the next.
        let mut readers = vec![first];
        while let Ok(reader) = rx.try_recv() {
            readers.push(reader);
        }
        readers.retain(|r| !r.is_closed());
        if readers.is_empty() {
            continue;
        }
        let index = round().await;
        for reader in readers {
            let _ = reader.send(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn readers_waiting_together_share_one_round_and_later_ones_a_later_round() {
        let (rounds, waiting) = ReadRounds::new();
        let started = Arc::new(AtomicU64::new(0));
        let (release_tx, release_rx) = tokio::sync::watch::channel(0u64);
        let counter = started.clone();
        tokio::spawn(run(
            waiting,
            move || {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let mut release = release_rx.clone();
                async move {
                    // A round ends only once the test lets it.
                    while *release.borrow_and_update() < n {
                        if release.changed().await.is_err() {
                            return None;
                        }
                    }
                    Some(n * 100)
                }
            },
            Duration::ZERO,
        ));
        let deadline = Instant::now() + Duration::from_secs(10);
        let first = tokio::spawn({
            let rounds = rounds.clone();
            async move { rounds.next_index(deadline).await }
        });
        // Round 1 is under way with the first reader once it has started.
        while started.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        // A hundred readers arrive during round 1: they must not be answered by it.
        let later: Vec<_> = (0..100)
            .map(|_| {
                let rounds = rounds.clone();
                tokio::spawn(async move { rounds.next_index(deadline).await })
            })
            .collect();
        // All hundred queued (round 1's own reader was taken off the queue already).
        while rounds.tx.capacity() > WAITING_READERS_MAX - 100 {
            tokio::task::yield_now().await;
        }
        release_tx.send(1).expect("release round 1");
        assert_eq!(first.await.expect("joined"), Some(100));
        release_tx.send(2).expect("release round 2");
        for reader in later {
            assert_eq!(reader.await.expect("joined"), Some(200), "answered by the round that began after it");
        }
        assert_eq!(started.load(Ordering::SeqCst), 2, "101 readers, two rounds");
    }

    #[tokio::test]
    async fn a_paced_lane_starts_one_round_per_pace_however_many_readers_come() {
        const PACE: Duration = Duration::from_millis(10);
        let (rounds, waiting) = ReadRounds::new();
        let started = Arc::new(AtomicU64::new(0));
        let counter = started.clone();
        tokio::spawn(run(
            waiting,
            move || {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move { Some(n) }
            },
            PACE,
        ));
        // Two hundred readers, one every millisecond or so, ten at once each time.
        let began = Instant::now();
        let deadline = began + Duration::from_secs(10);
        let mut readers = Vec::new();
        for _ in 0..200 {
            for _ in 0..10 {
                let rounds = rounds.clone();
                readers.push(tokio::spawn(async move { rounds.next_index(deadline).await }));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for reader in readers {
            assert!(reader.await.expect("joined").is_some(), "every reader answered");
        }
        let rounds_run = started.load(Ordering::SeqCst);
        let allowed = (began.elapsed().as_millis() / PACE.as_millis()) as u64 + 1;
        assert!(rounds_run <= allowed, "{rounds_run} rounds in {:?}: more than one per {PACE:?}", began.elapsed());
        assert!(rounds_run >= 5, "{rounds_run} rounds: the lane kept going");
    }
}
