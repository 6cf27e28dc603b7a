//! `raftbox_api::fuzz::xml_body` under libFuzzer.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| raftbox_api::fuzz::xml_body(data));
