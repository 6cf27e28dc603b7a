//! A linearizability checker: Wing & Gong's search with Lowe's just-in-time linearization
//! and a cache of (linearized set, state) pairs, as in Porcupine (`checker.go`), run per key.
//!
//! A history is a list of [`Operation`]s, each with the time it was invoked and, if the
//! client learned its outcome, the time it returned and what it returned. An operation whose
//! outcome is unknown (a timeout, a lost connection, a 5xx) has no return: it may have taken
//! effect at any point after its invocation, or never. It is treated as returning after
//! everything else, and [`Model::step`] accepts any output for it — so placing it last is the
//! same as leaving it out, and the search tries every earlier point too.
//!
//! The search walks the history's events in time order and linearizes, just in time, any
//! operation whose invocation it meets and which the model accepts; meeting the return of an
//! operation not yet linearized means a choice was wrong, so it backtracks. A pair of
//! (operations linearized, model state) seen before is not explored again.
//!
//! Unknown operations would make that search exponential — never returning, each stays
//! pending to the end, linearized or not at every step. Two rules keep it small, both exact:
//! an unknown operation that would not change the state where the search stands (a
//! compare-and-set on a stale base) is not linearized there, since placing it there or at the
//! end is the same; and the search succeeds as soon as every operation with a known outcome
//! is placed, since the unknown ones left can all go at the end.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash + Debug;
    type Input: Debug;
    type Output: Debug;
    fn init(&self) -> Self::State;
    /// The state after applying `input` that answered `output` (`None`: the answer is not
    /// known, any is acceptable), or `None` if `output` is impossible from `state`.
    fn step(&self, state: &Self::State, input: &Self::Input, output: Option<&Self::Output>) -> Option<Self::State>;
}

/// One client operation.
#[derive(Debug, Clone)]
pub struct Operation<I, O> {
    pub client: u64,
    pub input: I,
    /// Invocation time (any monotonic unit, e.g. µs since the test started).
    pub call: u64,
    /// Return time and output; `None` when the outcome is unknown.
    pub ret: Option<(u64, O)>,
}

/// What the search found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No linearization exists. `prefix`: the operations (indices into the history) of the
    /// longest linearizable prefix found, in order; `stuck`: the operation whose return the
    /// search reached with no choice left to undo.
    NotLinearizable {
        prefix: Vec<usize>,
        stuck: usize,
    },
    /// The search ran out of time; nothing is proven either way.
    TimedOut,
}

/// Iterations between two looks at the clock.
const CLOCK_CHECK_EVERY: u64 = 4_096;

/// A doubly linked list of events over arrays: node `2i` is operation `i`'s invocation,
/// `2i + 1` its return. Index `len` is the head sentinel.
struct Events {
    next: Vec<usize>,
    prev: Vec<usize>,
    head: usize,
}

impl Events {
    fn new(order: &[usize]) -> Events {
        let head = order.len();
        let mut next = vec![usize::MAX; head + 1];
        let mut prev = vec![usize::MAX; head + 1];
        let mut last = head;
        for &node in order {
            next[last] = node;
            prev[node] = last;
            last = node;
        }
        next[last] = usize::MAX;
        Events { next, prev, head }
    }

    fn first(&self) -> usize {
        self.next[self.head]
    }

    fn unlink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = n;
        if n != usize::MAX {
            self.prev[n] = p;
        }
    }

    /// Puts `node` back where it was (its own `prev`/`next` still say where).
    fn relink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = node;
        if n != usize::MAX {
            self.prev[n] = node;
        }
    }
}

fn set_bit(bits: &mut [u64], i: usize, on: bool) {
    if on {
        bits[i / 64] |= 1 << (i % 64);
    } else {
        bits[i / 64] &= !(1 << (i % 64));
    }
}

/// Checks one key's history against `model` within `budget`.
pub fn check<M: Model>(model: &M, history: &[Operation<M::Input, M::Output>], budget: Duration) -> Verdict {
    let started = Instant::now();
    let n = history.len();
    // Events in time order; an unknown return comes after every known event. On equal
    // times a call sorts before a return, so touching operations count as concurrent.
    let mut order: Vec<(u64, u8, usize)> = Vec::with_capacity(2 * n);
    for (i, op) in history.iter().enumerate() {
        order.push((op.call, 0, 2 * i));
        let ret = op.ret.as_ref().map_or(u64::MAX, |(t, _)| *t);
        order.push((ret.max(op.call), 1, 2 * i + 1));
    }
    order.sort_unstable();
    let mut events = Events::new(&order.iter().map(|(_, _, node)| *node).collect::<Vec<_>>());

    let known = history.iter().filter(|op| op.ret.is_some()).count();
    if known == 0 {
        return Verdict::Linearizable;
    }
    let mut known_placed = 0usize;
    let mut state = model.init();
    let mut linearized = vec![0u64; n.div_ceil(64)];
    let mut seen: HashSet<(Vec<u64>, M::State)> = HashSet::new();
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut longest: Vec<usize> = Vec::new();
    let mut iterations = 0u64;
    let mut cursor = events.first();
    while cursor != usize::MAX {
        iterations += 1;
        if iterations % CLOCK_CHECK_EVERY == 0 && started.elapsed() > budget {
            return Verdict::TimedOut;
        }
        let op = cursor / 2;
        if cursor % 2 == 0 {
            let output = history[op].ret.as_ref().map(|(_, o)| o);
            let is_known = output.is_some();
            if let Some(next_state) = model.step(&state, &history[op].input, output) {
                // An unknown operation that changes nothing here is left for the end.
                let worth_placing = is_known || next_state != state;
                set_bit(&mut linearized, op, true);
                if worth_placing && seen.insert((linearized.clone(), next_state.clone())) {
                    stack.push((op, state));
                    state = next_state;
                    events.unlink(2 * op);
                    events.unlink(2 * op + 1);
                    if is_known {
                        known_placed += 1;
                        if known_placed == known {
                            return Verdict::Linearizable;
                        }
                    }
                    if stack.len() > longest.len() {
                        longest = stack.iter().map(|(op, _)| *op).collect();
                    }
                    cursor = events.first();
                    continue;
                }
                set_bit(&mut linearized, op, false);
            }
            cursor = events.next[cursor];
        } else {
            // The return of an operation not linearized yet: undo the last choice.
            let Some((undone, previous)) = stack.pop() else {
                return Verdict::NotLinearizable { prefix: longest, stuck: op };
            };
            state = previous;
            if history[undone].ret.is_some() {
                known_placed -= 1;
            }
            set_bit(&mut linearized, undone, false);
            events.relink(2 * undone + 1);
            events.relink(2 * undone);
            cursor = events.next[2 * undone];
        }
    }
    Verdict::Linearizable
}

/// Checks a history split by key; on failure the error names the key and shows the
/// operations around the failure.
pub fn check_by_key<M: Model, K: Ord + Debug>(
    model: &M,
    history: Vec<(K, Operation<M::Input, M::Output>)>,
    budget: Duration,
) -> Result<(), String> {
    let mut by_key: BTreeMap<K, Vec<Operation<M::Input, M::Output>>> = BTreeMap::new();
    for (key, op) in history {
        by_key.entry(key).or_default().push(op);
    }
    let mut problems = Vec::new();
    for (key, ops) in &by_key {
        match check(model, ops, budget) {
            Verdict::Linearizable => {}
            Verdict::TimedOut => {
                problems.push(format!("{key:?}: no verdict within {budget:?} ({} operations)", ops.len()))
            }
            Verdict::NotLinearizable { prefix, stuck } => {
                let show = |i: usize| format!("  #{i} {:?}", ops[i]);
                let tail: Vec<String> = prefix.iter().rev().take(8).rev().map(|&i| show(i)).collect();
                problems.push(format!(
                    "{key:?}: not linearizable ({} operations). Longest linearizable prefix: {} operations, \
                     ending\n{}\nthen no order explains\n{}",
                    ops.len(),
                    prefix.len(),
                    tail.join("\n"),
                    show(stuck)
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// A file path as a versioned register: a commit names the version it was based on and
/// succeeds only on it (compare-and-set), making the next version; a read returns the
/// current version and content. Content ids stand for chunk lists; version 0 = no file.
#[derive(Debug, Clone, Copy, Default)]
pub struct VersionedRegister;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterInput {
    Commit { base: u64, content: u64 },
    Read,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterOutput {
    Committed {
        version: u64,
    },
    /// Stale base: nothing changed at the path; `current` is its version.
    Conflict {
        current: u64,
    },
    Read {
        version: u64,
        content: Option<u64>,
    },
}

impl Model for VersionedRegister {
    /// (version, content).
    type State = (u64, Option<u64>);
    type Input = RegisterInput;
    type Output = RegisterOutput;

    fn init(&self) -> Self::State {
        (0, None)
    }

    fn step(&self, state: &Self::State, input: &RegisterInput, output: Option<&RegisterOutput>) -> Option<Self::State> {
        let (version, _) = *state;
        match (input, output) {
            (RegisterInput::Commit { base, content }, None) => {
                Some(if *base == version { (version + 1, Some(*content)) } else { *state })
            }
            (RegisterInput::Commit { base, content }, Some(RegisterOutput::Committed { version: made })) => {
                (*base == version && *made == version + 1).then_some((version + 1, Some(*content)))
            }
            (RegisterInput::Commit { base, .. }, Some(RegisterOutput::Conflict { current })) => {
                (*base != version && *current == version).then_some(*state)
            }
            (RegisterInput::Read, None) => Some(*state),
            (RegisterInput::Read, Some(RegisterOutput::Read { version: v, content })) => {
                (*state == (*v, *content)).then_some(*state)
            }
            _ => None,
        }
    }
}
