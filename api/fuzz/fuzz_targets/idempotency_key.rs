//! `raftbox_api::fuzz::idempotency_key` under libFuzzer.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| raftbox_api::fuzz::idempotency_key(data));
