//! The fuzz targets (`raftbox_api::fuzz`) on stable, as CI's smoke of them: every seed in
//! `api/fuzz/seeds/<target>/`, then mutants of the seeds from one random seed for
//! `RAFTBOX_FUZZ_SECONDS` (default 5) per target — bytes flipped, inserted, cut, tokens of
//! the target's format spliced in, slices repeated hundreds of times (how deep nesting and
//! long runs come about). Each target runs on a thread with a tokio worker's 2 MiB stack: a
//! panic fails the test naming the target and the input (hex), and an abort or a stack
//! overflow ends the test process, which fails it too. `RAFTBOX_FUZZ_SEED=N` replays a run.
//!
//! This is not coverage-guided: `scripts/fuzz` runs the same targets under libFuzzer
//! (`cargo fuzz`) for as long as asked.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

/// The stack each target runs on: a tokio worker's.
const STACK_BYTES: usize = 2 << 20;
/// Longest input a mutant grows to.
const MUTANT_BYTES_MAX: usize = 96 * 1024;

fn seeds_of(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a seed").path())
        .collect();
    files.sort();
    files.iter().map(|path| std::fs::read(path).expect("read a seed")).collect()
}

/// Tokens worth splicing in, by the kind of input a target reads.
fn tokens(target: &str) -> &'static [&'static [u8]] {
    match target {
        "xml_body" | "dav_request" => &[
            b"<a>",
            b"</a>",
            b"<D:prop>",
            b"<!ENTITY x \"",
            b"&x;",
            b"<![CDATA[",
            b"]]>",
            b"xmlns:a=\"x\"",
            b"\xef\xbb\xbf",
            b"<?xml version=\"1.0\"?>",
            b"\n",
            b"\\",
            b"%5C",
            b"..",
            b"http://h/dav/",
            b"infinity",
            b"(<",
            b">)",
        ],
        "json_body" | "cursor" => &[b"[", b"]", b"{", b"}", b"\"", b"\\u0000", b"1e999", b"-0", b",", b":", b"null"],
        _ => &[b"/", b"..", b".", b"%2e", b"%2F", b"\\", b"%5C", b"\0", b"\n", b",", b":", b"\xc3", b"\xff", b" "],
    }
}

fn mutate(seeds: &[Vec<u8>], target: &str, rng: &mut StdRng) -> Vec<u8> {
    let mut data = seeds[rng.gen_range(0..seeds.len())].clone();
    for _ in 0..rng.gen_range(1..=4) {
        let at = rng.gen_range(0..=data.len());
        match rng.gen_range(0..7) {
            0 if !data.is_empty() => {
                let i = rng.gen_range(0..data.len());
                data[i] ^= 1 << rng.gen_range(0..8);
            }
            1 => data.insert(at, rng.gen()),
            2 if !data.is_empty() => {
                let end = rng.gen_range(at..=data.len().min(at + 64));
                data.drain(at..end);
            }
            3 => {
                let token = tokens(target)[rng.gen_range(0..tokens(target).len())];
                data.splice(at..at, token.iter().copied());
            }
            4 if !data.is_empty() => {
                // A slice repeated: nesting, long names, many fields.
                let start = rng.gen_range(0..data.len());
                let end = rng.gen_range(start..=data.len().min(start + 16));
                let slice = data[start..end].to_vec();
                for _ in 0..rng.gen_range(2..2_000) {
                    if data.len() + slice.len() > MUTANT_BYTES_MAX {
                        break;
                    }
                    data.splice(end..end, slice.iter().copied());
                }
            }
            5 => {
                let other = &seeds[rng.gen_range(0..seeds.len())];
                let from = rng.gen_range(0..=other.len());
                data.splice(at..at, other[from..].iter().copied());
            }
            _ => data.truncate(at),
        }
    }
    data.truncate(MUTANT_BYTES_MAX);
    data
}

fn seconds_per_target() -> f64 {
    std::env::var("RAFTBOX_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5.0)
}

fn seed() -> u64 {
    std::env::var("RAFTBOX_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random)
}

#[test]
fn every_fuzz_target_survives_its_seeds_and_their_mutants() {
    let seed = seed();
    let budget = Duration::from_secs_f64(seconds_per_target());
    println!("fuzz targets: seed {seed} (RAFTBOX_FUZZ_SEED={seed} replays), {budget:?} each");
    for (i, (name, target)) in raftbox_api::fuzz::TARGETS.iter().enumerate() {
        let (name, target) = (*name, *target);
        let seeds = seeds_of(name);
        assert!(!seeds.is_empty(), "no seeds for {name}");
        let current = Arc::new(Mutex::new(Vec::new()));
        let watched = current.clone();
        let runner =
            std::thread::Builder::new().name(format!("fuzz-{name}")).stack_size(STACK_BYTES).spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i as u64));
                let mut runs = 0usize;
                for input in &seeds {
                    *watched.lock().expect("input") = input.clone();
                    target(input);
                    runs += 1;
                }
                let started = Instant::now();
                while started.elapsed() < budget {
                    let input = mutate(&seeds, name, &mut rng);
                    *watched.lock().expect("input") = input.clone();
                    target(&input);
                    runs += 1;
                }
                runs
            });
        match runner.expect("a thread").join() {
            Ok(runs) => println!("  {name}: {runs} inputs"),
            Err(_) => {
                let input = current.lock().map(|i| i.clone()).unwrap_or_default();
                let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
                panic!("fuzz target {name} panicked (seed {seed}) on {} bytes: {hex}", input.len());
            }
        }
    }
}
