#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| countersign_fuzz::policy_eval::run(data));
