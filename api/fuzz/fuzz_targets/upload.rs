//! `raftbox_api::fuzz::upload` under libFuzzer.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| raftbox_api::fuzz::upload(data));
