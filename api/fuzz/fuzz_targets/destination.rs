//! `raftbox_api::fuzz::destination` under libFuzzer.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| raftbox_api::fuzz::destination(data));
