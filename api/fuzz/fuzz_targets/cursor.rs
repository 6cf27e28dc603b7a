//! `raftbox_api::fuzz::cursor` under libFuzzer.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| raftbox_api::fuzz::cursor(data));
