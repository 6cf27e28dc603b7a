//! The linearizability checker itself, on histories whose verdict is known: classic register
//! cases, unknown outcomes, lost updates, and simulated linearizable histories (which must
//! pass, quickly) with one read corrupted (which must fail).

use std::time::{Duration, Instant};

use raftbox_cluster_tests::checker::{check, Operation, RegisterInput, RegisterOutput, Verdict, VersionedRegister};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

const BUDGET: Duration = Duration::from_secs(10);

fn commit(
    client: u64,
    base: u64,
    content: u64,
    call: u64,
    ret: Option<(u64, RegisterOutput)>,
) -> Operation<RegisterInput, RegisterOutput> {
    Operation { client, input: RegisterInput::Commit { base, content }, call, ret }
}

fn read(
    client: u64,
    call: u64,
    ret: u64,
    version: u64,
    content: Option<u64>,
) -> Operation<RegisterInput, RegisterOutput> {
    Operation { client, input: RegisterInput::Read, call, ret: Some((ret, RegisterOutput::Read { version, content })) }
}

fn ok(t: u64, version: u64) -> Option<(u64, RegisterOutput)> {
    Some((t, RegisterOutput::Committed { version }))
}

fn verdict(history: &[Operation<RegisterInput, RegisterOutput>]) -> Verdict {
    check(&VersionedRegister, history, BUDGET)
}

#[test]
fn sequential_and_concurrent_histories() {
    // Sequential: commit, read.
    assert_eq!(verdict(&[commit(1, 0, 7, 0, ok(10, 1)), read(2, 20, 30, 1, Some(7))]), Verdict::Linearizable);
    // A read overlapping the commit may see either side.
    assert_eq!(verdict(&[commit(1, 0, 7, 0, ok(10, 1)), read(2, 5, 8, 0, None)]), Verdict::Linearizable);
    assert_eq!(verdict(&[commit(1, 0, 7, 0, ok(10, 1)), read(2, 5, 8, 1, Some(7))]), Verdict::Linearizable);
}

#[test]
fn a_stale_read_after_an_acknowledged_commit_fails() {
    let history = [commit(1, 0, 7, 0, ok(10, 1)), read(2, 20, 30, 0, None)];
    assert!(matches!(verdict(&history), Verdict::NotLinearizable { .. }), "{:?}", verdict(&history));
}

#[test]
fn a_lost_update_fails() {
    // Two commits on base 0 both acknowledged as version 1: one must have conflicted.
    let history = [commit(1, 0, 7, 0, ok(10, 1)), commit(2, 0, 8, 1, ok(11, 1))];
    assert!(matches!(verdict(&history), Verdict::NotLinearizable { .. }));
    // A read seeing content that no commit wrote.
    assert!(matches!(verdict(&[read(1, 0, 1, 1, Some(99))]), Verdict::NotLinearizable { .. }));
}

#[test]
fn unknown_commits_may_or_may_not_have_happened() {
    let unknown = commit(1, 0, 7, 0, None);
    assert_eq!(verdict(&[unknown.clone(), read(2, 50, 60, 1, Some(7))]), Verdict::Linearizable);
    assert_eq!(verdict(&[unknown.clone(), read(2, 50, 60, 0, None)]), Verdict::Linearizable);
    // But not happened, then undone.
    let history = [unknown, read(2, 50, 60, 1, Some(7)), read(2, 70, 80, 0, None)];
    assert!(matches!(verdict(&history), Verdict::NotLinearizable { .. }));
}

#[test]
fn conflicts_report_the_current_version() {
    let history = [
        commit(1, 0, 7, 0, ok(10, 1)),
        commit(2, 0, 8, 20, Some((30, RegisterOutput::Conflict { current: 1 }))),
        read(3, 40, 50, 1, Some(7)),
    ];
    assert_eq!(verdict(&history), Verdict::Linearizable);
    let wrong =
        [commit(1, 0, 7, 0, ok(10, 1)), commit(2, 0, 8, 20, Some((30, RegisterOutput::Conflict { current: 0 })))];
    assert!(matches!(verdict(&wrong), Verdict::NotLinearizable { .. }));
}

/// Histories of a simulated linearizable register: each operation takes effect at a
/// random instant inside its interval; some outcomes are lost.
fn simulated(seed: u64, clients: u64, ops: usize) -> Vec<Operation<RegisterInput, RegisterOutput>> {
    simulated_with_losses(seed, clients, ops, 0.05)
}

/// [`simulated`] with a share `lost` of operations whose outcome the client never learns:
/// half of those took effect, half never reached the cluster. Operations overlap widely.
fn simulated_with_losses(
    seed: u64,
    clients: u64,
    ops: usize,
    lost: f64,
) -> Vec<Operation<RegisterInput, RegisterOutput>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut state: (u64, Option<u64>) = (0, None);
    let mut free_at = vec![0u64; clients as usize];
    let mut known_version = vec![0u64; clients as usize];
    let mut history = Vec::new();
    let mut now = 0u64;
    for content in 0..ops as u64 {
        now += rng.gen_range(1..5);
        let c = rng.gen_range(0..clients) as usize;
        let call = now.max(free_at[c]);
        let effect = call + rng.gen_range(0..50);
        let ret = effect + rng.gen_range(0..200);
        free_at[c] = ret + 1;
        let unknown = rng.gen_bool(lost);
        let (input, output) = if !unknown && rng.gen_bool(0.4) {
            (RegisterInput::Read, RegisterOutput::Read { version: state.0, content: state.1 })
        } else {
            let base = known_version[c];
            let input = RegisterInput::Commit { base, content };
            if unknown && rng.gen_bool(0.5) {
                // Never reached the cluster: no effect, no answer.
                history.push(Operation { client: c as u64, input, call, ret: None });
                now = effect;
                continue;
            }
            if base == state.0 {
                state = (state.0 + 1, Some(content));
                (input, RegisterOutput::Committed { version: state.0 })
            } else {
                (input, RegisterOutput::Conflict { current: state.0 })
            }
        };
        if !unknown {
            known_version[c] = state.0;
        }
        history.push(Operation { client: c as u64, input, call, ret: (!unknown).then_some((ret, output)) });
        now = effect;
    }
    history
}

#[test]
fn simulated_linearizable_histories_pass_quickly() {
    for seed in 0..20 {
        let history = simulated(seed, 8, 500);
        let started = Instant::now();
        assert_eq!(verdict(&history), Verdict::Linearizable, "seed {seed}");
        assert!(started.elapsed() < Duration::from_secs(5), "seed {seed} took {:?}", started.elapsed());
    }
}

#[test]
fn a_corrupted_read_is_caught() {
    for seed in 0..20 {
        let mut history = simulated(seed, 8, 300);
        let Some(i) = history.iter().rposition(|op| matches!(op.input, RegisterInput::Read) && op.ret.is_some()) else {
            continue;
        };
        if let Some((t, _)) = history[i].ret {
            history[i].ret = Some((t, RegisterOutput::Read { version: 9_999, content: Some(123_456) }));
        }
        assert!(matches!(verdict(&history), Verdict::NotLinearizable { .. }), "seed {seed}");
    }
}

#[test]
fn many_unknown_outcomes_stay_fast() {
    // A partition leaves many commits unknown; each never returns, so without care the
    // search doubles with every one of them.
    for seed in 0..10 {
        let history = simulated_with_losses(seed, 16, 4_000, 0.2);
        let unknown = history.iter().filter(|op| op.ret.is_none()).count();
        let started = Instant::now();
        assert_eq!(verdict(&history), Verdict::Linearizable, "seed {seed}, {unknown} unknown");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "seed {seed}: {unknown} unknown took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn an_unknown_commit_cannot_explain_a_read_before_its_call() {
    // The unknown commit may take effect, but not before it was invoked.
    let history = [read(1, 0, 10, 1, Some(7)), commit(2, 0, 7, 20, None)];
    assert!(matches!(verdict(&history), Verdict::NotLinearizable { .. }));
}

/// The guard and scheduler checkers, each fed a history it must pass and the bad histories
/// it claims to catch.
mod guards {
    use std::collections::{BTreeMap, BTreeSet};

    use raftbox_cluster_tests::guard_checks::{
        check_acked_writes, check_admissions, check_due_fires, check_fire_times, check_fires, check_keyed_answers,
        AckedWrite, Admission, Bucket, FireCall,
    };

    const BUCKET: Bucket = Bucket { capacity: 10, refill_per_s: 5, clock_slack_ms: 0 };

    fn admitted(times: impl IntoIterator<Item = u64>) -> Vec<Admission> {
        times.into_iter().map(|t| Admission { call_ms: t, ret_ms: t + 3 }).collect()
    }

    #[test]
    fn admissions_within_the_bucket_pass() {
        // A full bucket at once, then one every 200 ms (5/s) for ten seconds.
        let mut times: Vec<u64> = vec![0; 10];
        times.extend((1..=50).map(|i| i * 200 + 10));
        check_admissions(&admitted(times), BUCKET).expect("within the bucket");
        check_admissions(&[], BUCKET).expect("nothing admitted");
    }

    #[test]
    fn one_admission_over_the_bucket_fails() {
        let error = check_admissions(&admitted(vec![0; 11]), BUCKET).expect_err("11 at once from a bucket of 10");
        assert!(error.to_string().contains("over-admission"), "{error}");
    }

    #[test]
    fn an_over_admission_inside_one_window_fails_where_the_whole_run_looks_fine() {
        // Over 60 s the bucket allows 10 + 300: 40 admissions are far below that, but 20 of
        // them inside one second is 5 over a full bucket plus one second's refill.
        let mut times: Vec<u64> = (0..20).map(|i| 30_000 + i * 50).collect();
        times.extend((0..20).map(|i| i * 3_000));
        times.push(60_000);
        assert!(times.len() as u64 <= BUCKET.allows(60_000));
        let error = check_admissions(&admitted(times), BUCKET).expect_err("a burst inside one window");
        assert!(error.to_string().contains("over-admission"), "{error}");
    }

    #[test]
    fn skewed_clocks_allow_the_refill_of_their_bound_and_no_more() {
        // With clocks skewed, a second of slack (twice a 500 ms bound) refills 5 more: 15
        // at once pass, 16 do not.
        let skewed = Bucket { clock_slack_ms: 1_000, ..BUCKET };
        check_admissions(&admitted(vec![0; 15]), skewed).expect("within the clock bound");
        let error = check_admissions(&admitted(vec![0; 16]), skewed).expect_err("beyond the clock bound");
        assert!(error.to_string().contains("over-admission"), "{error}");
    }

    #[test]
    fn an_admission_answered_late_is_not_counted_in_a_short_window() {
        // Eleven admissions, one of which was answered 3 s later: its decision may lie
        // anywhere in its span, so it does not prove an over-admission of the first second.
        let mut history = admitted(vec![0; 10]);
        history.push(Admission { call_ms: 0, ret_ms: 3_000 });
        check_admissions(&history, BUCKET).expect("the late answer may have been refilled");
    }

    fn fire(scheduled_s: u64, fence: u64, key: &str) -> FireCall {
        FireCall { job_id: "job".into(), scheduled_s, fence, key: key.into(), received_ms: scheduled_s * 1_000 + 20 }
    }

    /// A call for the fire due at `scheduled_s`, under `fence`, received at `received_ms`.
    fn arrived(scheduled_s: u64, fence: u64, received_ms: u64) -> FireCall {
        FireCall { received_ms, ..fire(scheduled_s, fence, &format!("job:{scheduled_s}")) }
    }

    const LEASE_MS: u64 = 3_000;
    const TOLERANCE_MS: u64 = 500;

    #[test]
    fn fires_on_time_and_a_rerun_after_a_lapsed_lease_pass() {
        // The fire at 10 s arrives 30 ms late, and again (fence 2) after its lease lapsed
        // (its first holder was cut off), its retried call under the same fence later still;
        // the fire at 11 s arrives 400 ms early, within the clock bound.
        let calls = [arrived(10, 1, 10_030), arrived(10, 2, 13_100), arrived(10, 2, 13_900), arrived(11, 3, 10_600)];
        check_fire_times(&calls, LEASE_MS, TOLERANCE_MS).expect("on time, one run per lease");
    }

    #[test]
    fn a_fire_before_its_time_fails() {
        // A node whose clock ran 2 s ahead claimed and fired early.
        let error = check_fire_times(&[arrived(10, 1, 8_000)], LEASE_MS, TOLERANCE_MS).expect_err("2 s early");
        assert!(error.to_string().contains("2000 ms early"), "{error}");
    }

    #[test]
    fn two_runs_of_one_fire_within_one_lease_fail() {
        // A second executor claimed the fire 1 s after the first: its lease had not lapsed.
        let calls = [arrived(10, 1, 10_020), arrived(10, 2, 11_000)];
        let error = check_fire_times(&calls, LEASE_MS, TOLERANCE_MS).expect_err("two runs in one lease");
        assert!(error.to_string().contains("run 2"), "{error}");
        // A third run needs two leases to lapse.
        let calls = [arrived(10, 1, 10_020), arrived(10, 2, 13_020), arrived(10, 3, 14_000)];
        let error = check_fire_times(&calls, LEASE_MS, TOLERANCE_MS).expect_err("a third run within two leases");
        assert!(error.to_string().contains("run 3"), "{error}");
    }

    fn write(path: &str, version: u64, content: &str) -> AckedWrite {
        AckedWrite { path: path.into(), version, content: content.into() }
    }

    fn histories(paths: &[(&str, &[&str])]) -> BTreeMap<String, BTreeMap<u64, String>> {
        paths
            .iter()
            .map(|(path, contents)| {
                let versions = contents.iter().enumerate().map(|(i, c)| (i as u64 + 1, c.to_string())).collect();
                (path.to_string(), versions)
            })
            .collect()
    }

    #[test]
    fn acknowledged_writes_read_back_pass() {
        // Version 2 of /a was an unknown outcome that took effect: not acknowledged, present.
        let read = histories(&[("/a", &["x", "y", "z"]), ("/b", &["w"])]);
        let acked = [write("/a", 1, "x"), write("/a", 3, "z"), write("/b", 1, "w")];
        assert_eq!(check_acked_writes(&read, &acked).expect("all there"), 4);
    }

    #[test]
    fn a_lost_or_changed_acknowledged_write_fails() {
        // The last acknowledged write of /a was lost (a node rolled back past it).
        let read = histories(&[("/a", &["x", "y"])]);
        let error = check_acked_writes(&read, &[write("/a", 3, "z")]).expect_err("version 3 lost");
        assert!(error.to_string().contains("not readable"), "{error}");
        // Version 2 holds other content than acknowledged (two commits took one version).
        let error = check_acked_writes(&read, &[write("/a", 2, "q")]).expect_err("version 2 changed");
        assert!(error.to_string().contains("found Some(\"y\")"), "{error}");
        // A path whose history skips a version.
        let mut gap = read.clone();
        gap.get_mut("/a").unwrap().insert(4, "v".into());
        let error = check_acked_writes(&gap, &[]).expect_err("a gap");
        assert!(error.to_string().contains("gapless"), "{error}");
    }

    #[test]
    fn ordered_fences_and_one_key_per_fire_pass() {
        // A retried call repeats its fire's key and fence.
        let calls = [fire(1, 1, "job:1"), fire(1, 1, "job:1"), fire(2, 2, "job:2"), fire(3, 5, "job:3")];
        let summary = check_fires(&calls).expect("a good history");
        assert_eq!((summary.calls, summary.fires.len(), summary.fences), (4, 3, 3));
    }

    #[test]
    fn a_duplicate_effect_fails() {
        // One fire delivered under two keys: the target applied it twice.
        let calls = [fire(1, 1, "job:1"), fire(1, 2, "job:1-again")];
        let error = check_fires(&calls).expect_err("two effects of one fire");
        assert!(error.to_string().contains("took effect 2 times"), "{error}");
    }

    #[test]
    fn a_fence_given_to_two_fires_fails() {
        let error = check_fires(&[fire(1, 7, "job:1"), fire(2, 7, "job:2")]).expect_err("a reused fence");
        assert!(error.to_string().contains("several fires"), "{error}");
    }

    #[test]
    fn a_fence_going_backwards_fails() {
        // The later fire got the older fence: a new leader handed out a fence again.
        let error = check_fires(&[fire(1, 9, "job:1"), fire(2, 4, "job:2")]).expect_err("fences out of order");
        assert!(error.to_string().contains("older than"), "{error}");
    }

    #[test]
    fn a_stale_fence_arriving_after_a_newer_one_fails() {
        // Run 1 (fence 4) called, its lease lapsed, run 2 (fence 5) called: in order.
        let good = [arrived(10, 4, 10_050), arrived(10, 5, 14_000), arrived(10, 5, 14_200)];
        check_fires(&good).expect("fences arrive in order");
        // The run that lost its lease calls after the run that took it over (issue 35: an
        // attempt held for a slot while its renewals failed started late).
        let late = [arrived(10, 5, 14_000), arrived(10, 4, 14_300)];
        let error = check_fires(&late).expect_err("a stale fence after a newer one");
        assert!(error.to_string().contains("fence 4 arrived at 14300 ms, after one with fence 5"), "{error}");
        // In the same millisecond the two are not ordered.
        check_fires(&[arrived(10, 5, 14_000), arrived(10, 4, 14_000)]).expect("unordered within a millisecond");
        // Another fire's calls are another order.
        check_fires(&[arrived(11, 6, 11_050), arrived(10, 5, 14_000)]).expect("two fires");
    }

    #[test]
    fn a_missing_fire_fails() {
        let fires: BTreeSet<(String, u64)> = [1, 2, 4].into_iter().map(|s| ("job".to_owned(), s)).collect();
        assert_eq!(check_due_fires(&fires, "job", 1, 3).expect("1 and 2 arrived"), 2);
        let error = check_due_fires(&fires, "job", 1, 5).expect_err("3 never arrived");
        assert!(error.to_string().contains("[3]"), "{error}");
        check_due_fires(&fires, "job", 4, 4).expect_err("an empty span proves nothing");
    }

    #[test]
    fn two_answers_for_one_key_fail() {
        let mut answers: BTreeMap<String, Vec<(u16, String)>> = BTreeMap::new();
        answers.insert("k1".into(), vec![(201, "u1".into()), (201, "u1".into())]);
        check_keyed_answers(&answers).expect("one answer, twice");
        answers.insert("k2".into(), vec![(201, "u2".into()), (201, "u3".into())]);
        let error = check_keyed_answers(&answers).expect_err("two users for one key");
        assert!(error.to_string().contains("k2"), "{error}");
    }
}
