//! The TOML config file: resolving never panics, and an error is one line that names the
//! file. Inputs that name a token file are skipped (resolving reads it).
#![no_main]

use std::io::Write;

use agui_serve::cli::ServeArgs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if text.contains("token_file") {
        return;
    }
    let path = std::env::temp_dir().join(format!("agui-fuzz-config-{}.toml", std::process::id()));
    let mut file = std::fs::File::create(&path).expect("temp file");
    file.write_all(text.as_bytes()).expect("write");
    drop(file);
    let args = ServeArgs {
        config: Some(path.clone()),
        token: Some("fuzz-token".to_owned()),
        ..ServeArgs::default()
    };
    if let Err(error) = args.resolve(&|_| None) {
        let message = error.to_string();
        assert!(!message.contains('\n'), "one line: {message}");
        assert!(!message.is_empty());
    }
});
