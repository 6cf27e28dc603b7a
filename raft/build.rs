//! Compiles the node-to-node protocol with a vendored protoc (no system install needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/raft.proto");
    tonic_build::configure()
        .bytes([".raftbox.raft.BlockData.data", ".raftbox.raft.AppendEntriesFrame"])
        .compile_protos(&["proto/raft.proto"], &["proto"])?;
    Ok(())
}
