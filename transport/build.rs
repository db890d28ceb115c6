//! Generates the tonic service and prost messages from proto/flotilla.proto with a vendored protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }
    println!("cargo:rerun-if-changed=proto/flotilla.proto");
    tonic_prost_build::configure().bytes(".").compile_protos(&["proto/flotilla.proto"], &["proto"])?;
    Ok(())
}
