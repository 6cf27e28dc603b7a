//! `raftbox_api::fuzz::json_body` under libFuzzer.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| raftbox_api::fuzz::json_body(data));
