//! Generates the AG-UI protobuf messages from the vendored schema (`proto/ag_ui`), parsed by
//! protox so that no `protoc` is needed. The output is `ag_ui.rs` in `OUT_DIR`, included by
//! `src/protocol/proto.rs`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const FILES: [&str; 3] = [
        "proto/ag_ui/events.proto",
        "proto/ag_ui/types.proto",
        "proto/ag_ui/patch.proto",
    ];
    for file in FILES {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(FILES, ["proto/ag_ui"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
