#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| countersign_fuzz::bundle_verify::run(data));
